"""Torch versions of the Triton kernels of vLLM's rejection sampler (speculative decoding).

vLLM's `vllm.v1.sample.rejection_sampler` launches four Triton kernels through module-level
dispatchers: greedy acceptance, random acceptance, the per-request to per-token expansion of
sampling parameters, and the sampling of "recovered" tokens at rejected positions. Triton has
no `tpu` target, so `install()` replaces those four module attributes with the functions below
(same arguments, same in-place outputs), written as batched torch ops that torch_pjrt lowers.
`rejection_sample` looks the names up at call time, so replacing the attributes is enough.

Layout shared by all of them (vLLM's): requests r = 0..B-1 own the draft tokens
cu[r-1] .. cu[r]-1 of the flat token arrays (cu = cu_num_draft_tokens, cu[-1] taken as 0);
`output_token_ids` is [B, max_spec_len + 1], prefilled by the caller with a placeholder that
positions after a rejection keep."""

from __future__ import annotations

import torch

_NAMES = ("_rejection_greedy_sample", "_rejection_random_sample", "_expand",
          "_sample_recovered_tokens")


def _draft_grid(cu: torch.Tensor, width: int):
    """Per request, the flat index of its draft position p (p < width) and whether p is one of
    its draft tokens. Returns (index [B, width] int64, valid [B, width] bool, count [B])."""
    cu = cu.to(torch.int64)
    start = torch.cat([cu.new_zeros(1), cu[:-1]])
    count = cu - start
    pos = torch.arange(width, device=cu.device, dtype=torch.int64)
    valid = pos.unsqueeze(0) < count.unsqueeze(1)
    index = start.unsqueeze(1) + pos.unsqueeze(0)
    return index, valid, count


def _token_requests(cu: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The request of each flat token: how many request ends lie at or before it."""
    tok = torch.arange(num_tokens, device=cu.device, dtype=torch.int64)
    return (tok.unsqueeze(1) >= cu.to(torch.int64).unsqueeze(0)).sum(dim=1)


def _take(flat: torch.Tensor, index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """flat[index] where valid; index is clamped so padded positions read an existing element
    (their values are masked out by every caller). An empty `flat` reads zeros."""
    if flat.shape[0] == 0:
        return torch.zeros(index.shape, dtype=flat.dtype, device=index.device)
    return flat[index.clamp(0, flat.shape[0] - 1)]


def _write(output_token_ids, rows, tokens, write, count, bonus_token_ids, all_accepted):
    """Stores tokens at the write positions and each fully accepted request's bonus token at
    position count, for the rows selected; everything else keeps its value."""
    width = output_token_ids.shape[1]
    out = output_token_ids.to(torch.int64)
    spec = width - 1
    body = torch.where(write & rows.unsqueeze(1), tokens.to(torch.int64), out[:, :spec])
    out = torch.cat([body, out[:, spec:]], dim=1)
    col = torch.arange(width, device=out.device, dtype=torch.int64)
    at_bonus = (col.unsqueeze(0) == count.unsqueeze(1)) & (all_accepted & rows).unsqueeze(1)
    out = torch.where(at_bonus, bonus_token_ids.reshape(-1, 1).to(torch.int64), out)
    output_token_ids.copy_(out.to(output_token_ids.dtype))


def _accepted_prefix(accepted: torch.Tensor, valid: torch.Tensor):
    """Positions written (valid and no rejection strictly before them) and whether every
    valid position was accepted (then the bonus token follows)."""
    rejected = valid & ~accepted
    before = torch.cumsum(rejected.to(torch.int64), dim=1) - rejected.to(torch.int64)
    write = valid & (before == 0)
    return write, ~rejected.any(dim=1)


def rejection_greedy_sample(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                            target_argmax, bonus_token_ids, is_greedy, max_spec_len,
                            uniform_probs, synthetic_conditional_rates) -> None:
    """Greedy rows: each draft token is kept while it equals the target's argmax; the first
    position where it differs gets the argmax and ends the request's tokens; a request whose
    drafts all match also gets its bonus token. Synthetic mode accepts a draft (>= 0) when its
    uniform draw is below the position's rate."""
    B = output_token_ids.shape[0]
    index, valid, count = _draft_grid(cu_num_draft_tokens, max_spec_len)
    draft = _take(draft_token_ids, index, valid).to(torch.int64)
    target = _take(target_argmax, index, valid).to(torch.int64)
    if synthetic_conditional_rates is not None:
        u = _take(uniform_probs, index, valid)
        rate = synthetic_conditional_rates[:max_spec_len].to(u.dtype).unsqueeze(0)
        accepted = (u < rate) & (draft >= 0)
        tokens = torch.where(accepted, draft, target)
    else:
        accepted = draft == target
        tokens = target
    write, all_accepted = _accepted_prefix(accepted, valid)
    rows = (torch.ones(B, dtype=torch.bool, device=output_token_ids.device)
            if is_greedy is None else is_greedy.to(torch.bool))
    _write(output_token_ids, rows, tokens, write, count, bonus_token_ids, all_accepted)


def rejection_random_sample(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                            draft_probs, target_probs, bonus_token_ids, recovered_token_ids,
                            uniform_probs, is_greedy, max_spec_len,
                            synthetic_conditional_rates) -> None:
    """Random rows: a draft token d at a position is accepted when
    target_prob(d) / draft_prob(d) >= u (draft_prob 1 without draft probabilities; a zero
    draft probability or a padded draft d < 0 rejects); the first rejected position gets the
    recovered token and ends the request's tokens; all accepted: the bonus token follows."""
    index, valid, count = _draft_grid(cu_num_draft_tokens, max_spec_len)
    draft = _take(draft_token_ids, index, valid).to(torch.int64)
    u = _take(uniform_probs, index, valid)
    if synthetic_conditional_rates is not None:
        rate = synthetic_conditional_rates[:max_spec_len].to(u.dtype).unsqueeze(0)
        accepted = u < rate
    else:
        column = draft.clamp(min=0).unsqueeze(-1)
        rows_t = _take(target_probs, index, valid)  # [B, S, V]
        target_prob = rows_t.gather(-1, column).squeeze(-1)
        if draft_probs is None:
            accepted = target_prob.to(u.dtype) >= u
        else:
            draft_prob = _take(draft_probs, index, valid).gather(-1, column).squeeze(-1)
            ratio = target_prob / torch.where(draft_prob > 0, draft_prob,
                                              torch.ones_like(draft_prob))
            accepted = (draft_prob > 0) & (ratio.to(u.dtype) >= u)
    accepted = accepted & (draft >= 0)
    recovered = _take(recovered_token_ids, index, valid).to(torch.int64)
    tokens = torch.where(accepted, draft, recovered)
    write, all_accepted = _accepted_prefix(accepted, valid)
    _write(output_token_ids, ~is_greedy.to(torch.bool), tokens, write, count, bonus_token_ids,
           all_accepted)


def expand(output, input, cu_num_tokens, replace_from, replace_to) -> None:
    """output[t] = input[request of t], with replace_from replaced by replace_to."""
    n = output.shape[0]
    if n == 0:
        return
    req = _token_requests(cu_num_tokens, n).clamp(max=input.shape[0] - 1)
    val = input[req]
    val = torch.where(val == replace_from, torch.full_like(val, replace_to), val)
    output.copy_(val)


def sample_recovered_tokens(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                            draft_probs, target_probs, inv_q, *, max_spec_len) -> None:
    """The token drawn at a rejected position: argmax over the vocabulary of
    p(v) * inv_q[request, v], p = max(target - draft, 0), or without draft probabilities the
    target's probabilities with the draft token itself excluded (exponential-race sampling:
    inv_q holds the reciprocals of Exp(1) draws)."""
    n = output_token_ids.shape[0]
    if n == 0:
        return
    V = target_probs.shape[1]
    req = _token_requests(cu_num_draft_tokens, n).clamp(max=inv_q.shape[0] - 1)
    if draft_probs is None:
        vocab = torch.arange(V, device=target_probs.device, dtype=torch.int64)
        own = vocab.unsqueeze(0) == draft_token_ids.to(torch.int64).unsqueeze(1)
        prob = torch.where(own, torch.zeros_like(target_probs), target_probs)
    else:
        prob = (target_probs - draft_probs).clamp(min=0.0)
    score = prob.to(inv_q.dtype) * inv_q[req]
    ids = score.argmax(dim=-1).clamp(max=V - 1)
    output_token_ids.copy_(ids.to(output_token_ids.dtype))


def install() -> None:
    """Points vLLM's rejection sampler at the torch versions above (idempotent)."""
    from vllm.v1.sample import rejection_sampler as rs

    missing = [name for name in _NAMES if not hasattr(rs, name)]
    if missing:  # another vLLM whose kernels moved: fail loudly rather than launch Triton
        raise RuntimeError(f"tpu: vLLM's rejection sampler has no {missing}; "
                           "torch_pjrt/serving/vllm/rejection.py needs updating")
    for name, fn in zip(_NAMES, (rejection_greedy_sample, rejection_random_sample, expand,
                                 sample_recovered_tokens)):
        setattr(rs, name, fn)


def _no_warmup(*args, **kwargs) -> None:
    """RejectionSampler registers a Triton warmup per kernel; a torch op's program is
    compiled at its first use and cached, so there is nothing to register."""


for _fn in (rejection_greedy_sample, rejection_random_sample, expand, sample_recovered_tokens):
    _fn.register_warmup = _no_warmup
