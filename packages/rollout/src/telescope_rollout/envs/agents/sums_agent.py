"""The quickstart's sums agent as a program: plain HTTP to its OpenAI endpoint, its answer in a file.

The built-in ``quickstart_agent_command`` runs it in the sandbox, once per episode: it reads the
opening conversation from ``$TELESCOPE_SAMPLE``, asks the model at ``$OPENAI_BASE_URL``, asks it to
check its answer, and writes the last reply to ``answer.txt``, which the reward reads. Standard
library only, so it runs on any Python; a template for agents of one's own in any language.
"""

from __future__ import annotations

import json
import os
import urllib.request

CHECK = "Check it, then reply with just the number."


def chat(messages: list[dict[str, object]]) -> dict[str, object]:
    """One chat completion: the assistant message."""
    body = {"model": os.environ.get("OPENAI_MODEL", "policy"), "messages": messages}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)["choices"][0]["message"]


def main() -> None:
    """Ask, ask again, write the last answer."""
    with open(os.environ["TELESCOPE_SAMPLE"]) as f:
        messages = json.load(f)["messages"]
    first = chat(messages)
    messages += [first, {"role": "user", "content": CHECK}]
    second = chat(messages)
    with open("answer.txt", "w") as f:
        f.write(str(second.get("content") or ""))


if __name__ == "__main__":
    main()
