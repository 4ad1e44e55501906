"""Sequence packing: FFD, sample boundaries, padding, dummy micro-batches, zig-zag ranks.

The steps: docs/algorithms.md#packing.
"""

import pytest
import torch
from torch.testing import assert_close

import telescope_algos as ta


def sample(n_prompt, n_comp, adv=1.0, **kw):
    return ta.TrainingSample(
        prompt_ids=list(range(100, 100 + n_prompt)),
        completion_ids=list(range(200, 200 + n_comp)),
        advantage=adv,
        **kw,
    )


def test_first_fit_decreasing():
    # sorted: 7(i1), 5(i0), 4(i3), 3(i2), 2(i4), capacity 10:
    # 7 → bin0 (room 3); 5 → bin1 (room 5); 4 → bin1 (room 1); 3 → bin0 (room 0); 2 → bin2
    assert ta.first_fit_decreasing([5, 7, 3, 4, 2], 10) == [[1, 2], [0, 3], [4]]
    assert ta.first_fit_decreasing([], 10) == []
    assert ta.first_fit_decreasing([12], 10) == [[0]]
    # bins that cannot take the smallest item are not looked at again: the same bins
    # sorted: 6(i0), 6(i1), 4(i2), 3(i3); capacity 9: 6 → bin0 (room 3); 6 → bin1 (room 3);
    # 4 → bin2 (room 5); 3 → bin0 (room 0)
    assert ta.first_fit_decreasing([6, 6, 4, 3], 9) == [[0, 3], [1], [2]]
    assert ta.first_fit_decreasing([5] * 5, 10) == [[0, 1], [2, 3], [4]]


def test_first_fit_decreasing_is_the_plain_algorithm():
    """The same bins as first fit decreasing looking at every bin for every item."""
    import random

    def plain(lengths, capacity):
        bins, room = [], []
        for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
            for b, free in enumerate(room):
                if lengths[i] <= free:
                    bins[b].append(i)
                    room[b] -= lengths[i]
                    break
            else:
                bins.append([i])
                room.append(capacity - lengths[i])
        return bins

    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(1, 40) for _ in range(rng.randint(0, 60))]
        capacity = rng.randint(20, 60)
        assert ta.first_fit_decreasing(lengths, capacity) == plain(lengths, capacity)


def test_layout_of_one_micro_batch():
    # sample a: prompt 2 + completion 3 (rollout logprobs −0.1, −0.2, −0.3); sample b: 1 + 2 (mask [1, 0])
    a = sample(2, 3, adv=0.5, rollout_logprobs=[-0.1, -0.2, -0.3])
    b = sample(1, 2, adv=-1.0, rollout_logprobs=[-0.4, None], completion_mask=[1, 0])
    [[mb]] = ta.pack_samples([b, a], seq_len=16, pad_to_multiple_of=6)
    assert mb.input_ids.shape == (1, 12)  # 5 + 3 = 8 tokens, padded to the next multiple of 6
    # the longer sample comes first (FFD order); padding restarts positions at 0 (ghost segment)
    assert mb.input_ids.tolist() == [[100, 101, 200, 201, 202, 100, 200, 201, 0, 0, 0, 0]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]]
    assert mb.loss_mask.tolist() == [
        [False, False, True, True, True, False, True, False, False, False, False, False]
    ]
    assert_close(mb.advantages, torch.tensor([[0.5] * 5 + [-1.0] * 3 + [0.0] * 4]))
    # rollout logprob of completion token i sits at index len(prompt) + i; prompt and None → 0.0
    assert_close(mb.rollout_logprobs, torch.tensor([[0, 0, -0.1, -0.2, -0.3, 0, -0.4, 0, 0, 0, 0, 0]]))
    assert (mb.num_samples, mb.num_tokens) == (2, 4)
    assert mb.loss_mask.dtype == torch.bool
    assert mb.input_ids.dtype == torch.long
    assert mb.advantages.dtype == torch.float32


def test_truncation_and_first_token_and_logprob_length():
    # prompt 0 tokens: the first completion token cannot be predicted, so it is not a loss token.
    s = ta.TrainingSample(
        prompt_ids=[], completion_ids=[1, 2, 3, 4, 5, 6], advantage=1.0, rollout_logprobs=[-1.0] * 9
    )
    [[mb]] = ta.pack_samples([s], seq_len=4)
    assert mb.input_ids.tolist() == [[1, 2, 3, 4]]  # cut to seq_len
    assert mb.loss_mask.tolist() == [[False, True, True, True]]
    assert_close(mb.rollout_logprobs, torch.tensor([[-1.0] * 4]))  # extra logprobs dropped
    short = sample(1, 3, rollout_logprobs=[-1.0])  # missing logprobs → 0.0
    [[mb]] = ta.pack_samples([short], seq_len=8)
    assert_close(mb.rollout_logprobs, torch.tensor([[0.0, -1.0, 0.0, 0.0]]))


def test_teacher_and_reference_logprobs_are_packed_like_the_rollout_ones():
    # a None entry → 0.0 like a missing rollout logprob; nobody has reference ones
    a = sample(2, 2, teacher_logprobs=[-0.5, None])
    b = sample(1, 1, teacher_logprobs=[-1.5])
    [[mb]] = ta.pack_samples([a, b], seq_len=16, pad_to_multiple_of=3)
    assert mb.ref_logprobs is None
    assert mb.teacher_logprobs is not None
    assert_close(mb.teacher_logprobs, torch.tensor([[0.0, 0.0, -0.5, 0.0, 0.0, -1.5]]))
    # a step where some samples have them and others not: refused (0.0 would read as a sure teacher)
    with pytest.raises(ValueError, match="1 of 2 samples have no teacher_logprobs"):
        ta.pack_samples([a, sample(1, 1)], seq_len=16)
    # branches of a shared prompt keep their own tokens' values
    c = sample(2, 2, ref_logprobs=[-1.0, -2.0])
    d = sample(2, 2, ref_logprobs=[-3.0, -4.0])
    [[mb]] = ta.pack_samples([c, d], seq_len=16, share_prompts=True)
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 1, 2, 3]]
    assert mb.teacher_logprobs is None
    assert_close(mb.ref_logprobs, torch.tensor([[0.0, 0.0, -1.0, -2.0, 0.0, -3.0, -4.0]]))
    padded = ta.pad_micro_batch(mb, 4)
    assert padded.ref_logprobs is not None
    assert padded.ref_logprobs.shape == (1, 8)
    assert padded.teacher_logprobs is None


def test_ranks_get_equal_counts_dummies_and_zigzag():
    # lengths 9, 8, 7, 6, 5 with seq_len 10 → five micro-batches; three ranks → one dummy (a copy of
    # the first, length 9, mask 0). Sorted 9, 9(dummy), 8, 7, 6, 5 dealt 0 1 2 | 2 1 0.
    samples = [sample(2, n - 2, adv=float(n)) for n in (5, 9, 7, 6, 8)]
    ranks = ta.pack_samples(samples, seq_len=10, num_ranks=3)
    assert [len(r) for r in ranks] == [2, 2, 2]
    assert [[len(mb) for mb in r] for r in ranks] == [[9, 5], [9, 6], [8, 7]]
    dummies = [mb for r in ranks for mb in r if mb.num_samples == 0]
    assert len(dummies) == 1
    assert dummies[0].num_tokens == 0
    assert not dummies[0].loss_mask.any()
    assert not dummies[0].advantages.any()
    assert sum(mb.num_samples for r in ranks for mb in r) == 5


def test_padding_multiple_and_empty_input():
    [[mb]] = ta.pack_samples([sample(3, 4)], seq_len=64, pad_to_multiple_of=16)
    assert len(mb) == 16
    assert mb.position_ids[0, 7:].tolist() == list(range(9))
    assert ta.pack_samples([], seq_len=8, num_ranks=2) == [[], []]


def test_errors():
    with pytest.raises(ValueError, match="at least one token"):
        ta.pack_samples([ta.TrainingSample([], [], 0.0)], seq_len=8)
    with pytest.raises(ValueError, match="completion_mask"):
        ta.pack_samples([sample(1, 3, completion_mask=[1, 1])], seq_len=8)
    with pytest.raises(ValueError, match=">= 1"):
        ta.pack_samples([sample(1, 3)], seq_len=0)


def test_packed_micro_batches_match_the_padded_computation_end_to_end():
    # A toy "model" whose logits at a position depend only on that token and its position inside its
    # sample, so packing cannot change them: logits = E[token] + P[position].
    torch.manual_seed(0)
    vocab, n = 300, 12
    emb, pos_emb = torch.randn(vocab, vocab), torch.randn(64, vocab)
    samples = []
    for i in range(n):
        p, c = 1 + i % 3, 2 + (5 * i) % 11
        samples.append(
            ta.TrainingSample(
                prompt_ids=torch.randint(0, vocab, (p,)).tolist(),
                completion_ids=torch.randint(0, vocab, (c,)).tolist(),
                advantage=float(torch.randn(())),
                rollout_logprobs=(-torch.rand(c) * 5).tolist(),
            )
        )
    options = ta.LossOptions(algorithm="gspo", clip_low=0.2, clip_high=0.2, use_tis=True, kl_penalty_tau=0.01)

    def run(batch_ids, position_ids, **kw):
        logits = (emb[batch_ids] + pos_emb[position_ids]).requires_grad_()
        logprobs, entropy = ta.token_logprobs_and_entropy(logits, batch_ids, temperature=0.8, chunk_size=7)
        return logprobs, entropy

    ranks = ta.pack_samples(samples, seq_len=24, pad_to_multiple_of=8, num_ranks=2)
    total_tokens = sum(mb.num_tokens for r in ranks for mb in r)
    packed_loss = 0.0
    for r in ranks:
        for mb in r:
            logprobs, entropy = run(mb.input_ids, mb.position_ids)
            loss, _ = ta.compute_loss(
                ta.LossInputs(
                    logprobs,
                    advantages=mb.advantages,
                    loss_mask=mb.loss_mask,
                    rollout_logprobs=mb.rollout_logprobs,
                    entropy=entropy,
                    position_ids=mb.position_ids,
                    num_tokens=total_tokens,
                ),
                options,
            )
            packed_loss = packed_loss + loss
    # padded: one sample per row, right padding
    t = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    ids = torch.zeros(n, t, dtype=torch.long)
    mask = torch.zeros(n, t, dtype=torch.bool)
    rollout = torch.zeros(n, t)
    for i, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        ids[i, : p + c] = torch.tensor([*s.prompt_ids, *s.completion_ids])
        mask[i, p : p + c] = True
        rollout[i, p : p + c] = torch.tensor(s.rollout_logprobs)
    logprobs, entropy = run(ids, torch.arange(t).expand(n, t))
    padded_loss, _ = ta.compute_loss(
        ta.LossInputs(
            logprobs,
            advantages=torch.tensor([s.advantage for s in samples]),
            loss_mask=mask,
            rollout_logprobs=rollout,
            entropy=entropy,
        ),
        options,
    )
    assert_close(packed_loss, padded_loss)


def test_pad_micro_batch_adds_a_padding_segment_without_loss_tokens():
    [[mb]] = ta.pack_samples([sample(2, 3, 1.5)], seq_len=16)
    assert len(mb) == 5
    padded = ta.pad_micro_batch(mb, 4)
    assert len(padded) == 8
    assert padded.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]  # positions restart at 0
    assert padded.loss_mask[0, 5:].tolist() == [False] * 3
    assert padded.advantages[0, 5:].tolist() == [0.0] * 3
    assert padded.input_ids[0, :5].tolist() == mb.input_ids[0].tolist()
    assert (padded.num_tokens, padded.num_samples) == (mb.num_tokens, mb.num_samples)
    assert ta.pad_micro_batch(padded, 4) is padded  # already a multiple
    assert ta.pad_micro_batch(mb, 1) is mb


def _group(prompt, completions, advs):
    return [
        ta.TrainingSample(prompt_ids=prompt, completion_ids=c, advantage=a, rollout_logprobs=[-0.5] * len(c))
        for c, a in zip(completions, advs, strict=True)
    ]


def test_shared_prompts_pack_a_group_as_one_root_and_branches():
    # three samples of prompt [5, 6, 7]: sharing stops at the first loss token and keeps the last shared
    # token in each branch (its output predicts the branch's first loss token), so a branch takes 2 of
    # the root's tokens and starts at position 2; a fourth sample with another prompt stays whole
    group = _group([5, 6, 7], [[8, 9], [10], [8, 11]], [1.0, 2.0, 3.0])
    other = ta.TrainingSample(prompt_ids=[5, 40], completion_ids=[41], advantage=4.0)
    [[mb]] = ta.pack_samples([*group, other], seq_len=32, share_prompts=True)
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 9, 7, 10, 7, 8, 11, 5, 40, 41]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3, 2, 3, 4, 0, 1, 2]]
    assert mb.loss_mask.long().tolist() == [[0, 0, 0, 1, 1, 0, 1, 0, 1, 1, 0, 0, 1]]
    assert mb.advantages.tolist() == [[1.0] * 5 + [2.0] * 2 + [3.0] * 3 + [4.0] * 3]
    assert (mb.num_samples, mb.num_tokens) == (4, 6)
    # the loss finds four samples: a branch is a sample of its own
    assert ta.backend.segment_ids_from_position_ids(mb.position_ids).tolist() == [
        [0] * 5 + [1] * 2 + [2] * 3 + [3] * 3
    ]
    # without sharing every sample is whole: 5 + 4 + 5 + 3 = 17 tokens
    [[plain]] = ta.pack_samples([*group, other], seq_len=32)
    assert len(plain) == 17
    assert plain.num_tokens == 6


def test_a_family_that_would_pass_seq_len_starts_a_new_root():
    group = _group([5, 6, 7], [[8, 9], [10, 11], [12, 13]], [1.0, 2.0, 3.0])
    # root 5 tokens + branch 3 = 8 fits; the third would make 11 > 10, so it opens its own family
    shards = ta.pack_samples(group, seq_len=10, share_prompts=True)
    rows = sorted(mb.position_ids[0].tolist() for mb in shards[0])
    assert rows == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 2, 3, 4]]


def test_a_sample_without_loss_tokens_is_packed_whole():
    # a filtered sample (completion mask all 0) has no first loss token: it keeps all of its tokens
    group = _group([5, 6, 7], [[8, 9], [10]], [1.0, 2.0])
    masked = ta.TrainingSample(
        prompt_ids=[5, 6, 7], completion_ids=[8, 12], advantage=0.0, completion_mask=[0, 0]
    )
    [[mb]] = ta.pack_samples([*group, masked], seq_len=32, share_prompts=True)
    # the family (root 5 + branch 2 tokens) is the longer item, so it comes first
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3, 0, 1, 2, 3, 4]]
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 9, 7, 10, 5, 6, 7, 8, 12]]
    assert mb.num_tokens == 3
