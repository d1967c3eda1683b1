"""Slow, obvious numpy twins of every Numba kernel in ``kernels/``; tests assert the two agree.

Each twin is written for clarity, not speed: plain loops or the most direct numpy expression.
Add a twin by appending a section (helpers working in parallel append with ``cat >>``). The Criteo parsing
twins are in ``naive_criteo.py``, re-exported here.
"""

from __future__ import annotations

import numpy as np  # noqa: F401

# the Criteo parsing twins live in naive_criteo.py; re-exported so that ``naive.criteo_*`` keeps working
from naive_criteo import (  # noqa: F401
    CRITEO_REASONS,
    criteo_format_line,
    criteo_id_maps,
    criteo_map_categories,
    criteo_parse_line,
    criteo_reference,
    criteo_split_lines,
)


# ---- kernels/sparse_update.py ----------------------------------------------------------------------
def sparse_sgd(table, ids, grads, lr):
    """Row by row: sum each distinct id's gradients in input order, then one SGD update per row."""
    table = table.copy()
    for r in sorted(set(int(i) for i in ids)):
        g = np.zeros(table.shape[1], dtype=np.float32)
        for j, i in enumerate(ids):
            if i == r:
                g += grads[j]
        table[r] -= np.float32(lr) * g
    return table


def sparse_rowwise_adagrad(table, state, ids, grads, lr, eps):
    """Row by row: summed gradient g, state += mean(g^2), row -= lr * g / (sqrt(state) + eps)."""
    table, state = table.copy(), state.copy()
    for r in sorted(set(int(i) for i in ids)):
        g = np.zeros(table.shape[1], dtype=np.float32)
        for j, i in enumerate(ids):
            if i == r:
                g += grads[j]
        state[r] += np.float32(np.mean(g.astype(np.float64) ** 2))
        table[r] -= np.float32(lr) * g / (np.sqrt(state[r]) + np.float32(eps))
    return table, state


def _summed(ids, grads, r, dim):
    g = np.zeros(dim, dtype=np.float32)
    for j, i in enumerate(ids):
        if i == r:
            g += grads[j]
    return g


def sparse_adagrad(table, state, ids, grads, lr, eps):
    """Row by row, element by element: summed gradient g, state += g^2, w -= lr * g / (sqrt(state) + eps)."""
    table, state = table.copy(), state.copy()
    for r in sorted(set(int(i) for i in ids)):
        g = _summed(ids, grads, r, table.shape[1])
        state[r] += g * g
        table[r] -= np.float32(lr) * g / (np.sqrt(state[r]) + np.float32(eps))
    return table, state


def sparse_adam(table, state, ids, grads, lr, beta1, beta2, eps, iteration=0, weight_decay=0.0):
    """Row by row: summed gradient g; the row's counter t += 1 (last state column); m and v (the first D and
    next D columns) move as Adam's moments; w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps), with
    t the row's counter, or ``iteration`` for every row when it is > 0; with ``weight_decay`` the step is
    lr * (that ratio + weight_decay * w)."""
    table, state = table.copy(), state.copy()
    D = table.shape[1]
    f = np.float32
    for r in sorted(set(int(i) for i in ids)):
        g = _summed(ids, grads, r, D)
        state[r, 2 * D] += f(1)
        t = state[r, 2 * D] if iteration == 0 else f(iteration)
        m = f(beta1) * state[r, :D] + (f(1) - f(beta1)) * g
        v = f(beta2) * state[r, D : 2 * D] + (f(1) - f(beta2)) * g * g
        state[r, :D], state[r, D : 2 * D] = m, v
        c1, c2 = f(1) - f(beta1) ** t, f(1) - f(beta2) ** t
        if weight_decay:
            table[r] -= f(lr) * ((m / c1) / (np.sqrt(v / c2) + f(eps)) + f(weight_decay) * table[r])
        else:
            table[r] -= f(lr) * (m / c1) / (np.sqrt(v / c2) + f(eps))
    return table, state


# ---------------------------------------------------------------- kernels/profile.py (popularity profiler)


def _bags(sparse, num_tables, bag_sizes):
    """Per sample, per table: the list of its real ids (padding -1 dropped), from [n, T, L], [n, T] or [n, C]."""
    sparse = np.asarray(sparse)
    if bag_sizes is None:
        sparse = sparse.reshape(
            sparse.shape[0], num_tables, sparse.size // max(1, sparse.shape[0] * num_tables)
        )
        return [
            [[int(v) for v in sparse[i, t] if v != -1] for t in range(num_tables)] for i in range(len(sparse))
        ]
    ends = np.cumsum(bag_sizes)
    return [
        [[int(v) for v in sparse[i, e - b : e] if v != -1] for b, e in zip(bag_sizes, ends)]
        for i in range(len(sparse))
    ]


def profile_lookup_counts(sparse, table_sizes, bag_sizes=None):
    """Accesses per fused row (table offset + row id), one lookup at a time (padding -1 skipped)."""
    offsets = np.concatenate([[0], np.cumsum(table_sizes)]).astype(np.int64)
    counts = np.zeros(int(offsets[-1]), dtype=np.int64)
    for sample in _bags(sparse, len(table_sizes), bag_sizes):
        for t, bag in enumerate(sample):
            for v in bag:
                counts[offsets[t] + v] += 1
    return counts


def profile_sample_max_rank(sparse, table_sizes, rank, bag_sizes=None):
    """For each sample, the largest rank of the fused rows it looks up (-1 if it looks up nothing)."""
    offsets = np.concatenate([[0], np.cumsum(table_sizes)]).astype(np.int64)
    samples = _bags(sparse, len(table_sizes), bag_sizes)
    out = np.full(len(samples), -1, dtype=np.int64)
    for i, sample in enumerate(samples):
        for t, bag in enumerate(sample):
            for v in bag:
                out[i] = max(out[i], int(rank[offsets[t] + v]))
    return out


def profile_sample_max_cold(sparse, table_sizes, hot, bag_sizes=None):
    """For each sample, 1 if it looks up a row outside ``hot`` (bool per fused row), 0 if not, -1 if nothing."""
    return profile_sample_max_rank(sparse, table_sizes, (~np.asarray(hot, bool)).astype(np.int64), bag_sizes)


def profile_add_histogram(values, hist):
    """hist[v] += 1 for each value, one at a time."""
    hist = hist.copy()
    for v in values:
        hist[int(v)] += 1
    return hist


# ---- kernels/gather.py -----------------------------------------------------------------------------
def gather_rows(table, rows):
    return np.stack([table[r] for r in rows]) if len(rows) else table[:0].copy()


def scatter_rows(table, rows, src):
    table = table.copy()
    for i, r in enumerate(rows):
        table[r] = src[i]
    return table


def forward_stale(work, state, slots, owners, owner_slots, rows, live):
    """Copies of ``work`` / ``state`` with the stale slots held by a live step copied from its buffers; the
    slots left; the count forwarded. ``live``: ``(step, work, state, rows)`` of each live step."""
    work, state = work.copy(), state.copy()
    by_step = {step: (w, s, r) for step, w, s, r in live}
    rest, forwarded = [], 0
    for slot, owner, theirs in zip(slots, owners, owner_slots):
        if owner not in by_step:
            rest.append(slot)
            continue
        w, s, r = by_step[owner]
        assert r[theirs] == rows[slot]
        work[slot] = w[theirs]
        if state.size:
            state[slot] = s[theirs]
        forwarded += 1
    return work, state, np.array(rest, np.int64), forwarded


def partition_stale(slots, owners, owner_slots, rows, live_steps, live_rows):
    """For each live step, the stale slots it holds and where, in the slots' order; the slots left."""
    held = dict(zip(live_steps, live_rows))
    groups = {step: ([], []) for step in live_steps}
    rest = []
    for slot, owner, theirs in zip(slots, owners, owner_slots):
        if owner not in held:
            rest.append(slot)
            continue
        assert held[owner][theirs] == rows[slot]
        groups[owner][0].append(slot)
        groups[owner][1].append(theirs)
    as_array = lambda x: np.array(x, np.int64)  # noqa: E731
    return [(as_array(groups[s][0]), as_array(groups[s][1])) for s in live_steps], as_array(rest)


# ---- kernels/dispatch.py ---------------------------------------------------------------------------
def split_batch(sparse, table_sizes, hot_ids, bag_sizes=None):
    """Sample by sample: popular iff every lookup is hot; non-popular lookups remapped to hot slots or to
    working-buffer slots in first-occurrence order. Returns a dict of lists. With ``bag_sizes`` the ids are
    [B, C] bags padded with -1: padding slots are skipped, and ``pop_pos`` lists the popular real slots."""
    if bag_sizes is not None:
        cols = [t for t, n in enumerate(bag_sizes) for _ in range(n)]
        sparse = np.asarray(sparse)[:, :, None]  # column c as a "table" cols[c] of one id
    else:
        cols = None
    B, T, L = sparse.shape
    table_of = (lambda t: t) if cols is None else (lambda c: cols[c])
    offsets = np.concatenate([[0], np.cumsum(table_sizes)[:-1]])
    hot_offsets = np.concatenate([[0], np.cumsum([len(h) for h in hot_ids])])
    slot = {}
    for t in range(len(hot_ids)):
        for i, r in enumerate(hot_ids[t]):
            slot[(t, int(r))] = int(hot_offsets[t] + i)
    out = {
        k: []
        for k in (
            "popular",
            "non_popular",
            "pop_ids",
            "hot_pos",
            "hot_slot",
            "cold_pos",
            "cold_slot",
            "working_set",
            "pop_pos",
        )
    }
    for b in range(B):
        keys = [
            (table_of(t), int(sparse[b, t, l])) for t in range(T) for l in range(L) if sparse[b, t, l] != -1
        ]
        (out["popular"] if all(k in slot for k in keys) else out["non_popular"]).append(b)
    for i, b in enumerate(out["popular"]):
        for c, (t, l) in enumerate((t, l) for t in range(T) for l in range(L)):
            if sparse[b, t, l] != -1 or cols is None:
                out["pop_ids"].append(slot[(table_of(t), int(sparse[b, t, l]))])
                out["pop_pos"].append(i * T * L + c)
    for i, b in enumerate(out["non_popular"]):
        for c, (t, l) in enumerate((t, l) for t in range(T) for l in range(L)):
            if cols is not None and sparse[b, t, l] == -1:
                continue
            key = (table_of(t), int(sparse[b, t, l]))
            k = i * T * L + c
            if key in slot:
                out["hot_pos"].append(k)
                out["hot_slot"].append(slot[key])
            else:
                fid = int(offsets[key[0]] + key[1])
                if fid not in out["working_set"]:
                    out["working_set"].append(fid)
                out["cold_pos"].append(k)
                out["cold_slot"].append(out["working_set"].index(fid))
    return out


# ---- kernels/probe.py ----------------------------------------------------------------------------------
def remap_gather(ids, col_offset, remap):
    """The probe's lookups, one by one: remap entry of every id's fused row, row-major."""
    return np.array(
        [int(remap[col_offset[c] + ids[b, c]]) for b in range(ids.shape[0]) for c in range(ids.shape[1])],
        dtype=np.int64,
    )


def hot_rank_slots(words, rank_to_slot):
    """Decodes a ``hot_rank_index`` row by row (bit tested, lower bits counted one by one): every row's hot
    slot, or -1, over the index's whole 64-row words."""
    out = []
    for w in range(len(words) // 2):
        word, before = int(words[2 * w]), int(words[2 * w + 1])
        for i in range(64):
            if word >> i & 1:
                out.append(int(rank_to_slot[before + sum(word >> j & 1 for j in range(i))]))
            else:
                out.append(-1)
    return out


def claim_rows(working_set, held, step, fresh_before):
    """Slots whose row's previous holder step is >= fresh_before, with that step and the row's slot in its
    working set; then every row is held by ``step`` at its slot. ``held`` as a (step, slot) pair per row."""
    held = list(held)
    stale, owners, slots = [], [], []
    for s, r in enumerate(working_set):
        owner, slot = held[r]
        if owner >= fresh_before:
            stale.append(s)
            owners.append(owner)
            slots.append(slot)
        held[r] = (step, s)
    return stale, owners, slots, held


# --- synthetic data generator (kernels/synthetic.py) ------------------------------------------------------

_U64 = (1 << 64) - 1


def _splitmix64_finaliser(x: int) -> int:
    """splitmix64's finaliser on a Python int, masking to 64 bits after every step."""
    x = (x + 0x9E3779B97F4A7C15) & _U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _U64
    return x ^ (x >> 31)


def _unit_from_hash(h: int) -> float:
    return (h >> 11) / 2.0**53


def synthetic_zipf_ranks(u, n: int, s: float, redraw_key: int = 0):
    """Zipf ranks by rejection-inversion, one Python loop per draw, from the textbook formulas."""
    import math

    def hat_integral(x):  # integral of t ** -s from 1 to x: (x ** (1 - s) - 1) / (1 - s), log(x) at s = 1
        q = (1.0 - s) * math.log(x)
        ratio = math.expm1(q) / q if abs(q) > 1e-8 else 1.0 + q * 0.5 * (1.0 + q / 3.0 * (1.0 + 0.25 * q))
        return ratio * math.log(x)

    def hat_integral_inverse(y):
        t = max(y * (1.0 - s), -1.0)
        # IEEE results where Python's math raises: log1p(-1) = -inf, exp(overflow) = inf (far-tail draws).
        log1p_t = math.log1p(t) if t > -1.0 else -math.inf
        ratio = log1p_t / t if abs(t) > 1e-8 else 1.0 - t * (0.5 - t * (1.0 / 3.0 - 0.25 * t))
        return math.exp(ratio * y) if ratio * y < 709.0 else math.inf

    def hat(x):
        return math.exp(-s * math.log(x))

    u = np.asarray(u, dtype=np.float64)
    flat = u.reshape(-1)
    out = np.empty(flat.size, np.int64)
    h_first = hat_integral(1.5) - 1.0
    h_last = hat_integral(n + 0.5)
    squeeze = 2.0 - hat_integral_inverse(hat_integral(2.5) - hat(2.0))
    for i, v in enumerate(flat.tolist()):
        attempt = 0
        while True:
            y = h_last + v * (h_first - h_last)
            x = hat_integral_inverse(y)
            k = n if x >= n + 0.5 else max(math.floor(x + 0.5), 1)
            if k - x <= squeeze or y >= hat_integral(k + 0.5) - hat(k):
                out[i] = k - 1
                break
            attempt += 1
            v = _unit_from_hash(
                _splitmix64_finaliser((_splitmix64_finaliser(i ^ redraw_key) + attempt) & _U64)
            )
    return out.reshape(u.shape)


def synthetic_bag_effects(ranks, key: int, rank_scale: float):
    """Mean over each bag of sqrt(3) * (2 U(r, key) - 1) / sqrt(1 + r / rank_scale), one rank at a time."""
    import math

    ranks = np.asarray(ranks)
    out = np.zeros(ranks.shape[0])
    for i in range(ranks.shape[0]):
        values = [
            (2.0 * _unit_from_hash(_splitmix64_finaliser(int(r) ^ key)) - 1.0)
            * math.sqrt(3.0)
            / math.sqrt(1.0 + int(r) / rank_scale)
            for r in ranks[i]
        ]
        out[i] = sum(values) / len(values) if values else 0.0
    return out


# ---------------------------------------------------------------- kernels/reuse.py (LRU stack distances)


def lru_stack_distances(trace):
    """Simulates an LRU stack (most recent first): an access's distance is its id's depth in the stack
    before the access (-1 if absent); the id then moves to the top."""
    stack = []
    out = []
    for x in np.asarray(trace).reshape(-1).tolist():
        if x in stack:
            depth = stack.index(x)
            out.append(depth)
            stack.pop(depth)
        else:
            out.append(-1)
        stack.insert(0, x)
    return np.array(out, dtype=np.int64)


def lru_misses(trace, cache_rows):
    """Misses of an LRU cache holding ``cache_rows`` ids over ``trace``, simulated with an ordered list."""
    cache = []
    misses = 0
    for x in np.asarray(trace).reshape(-1).tolist():
        if x in cache:
            cache.remove(x)
        else:
            misses += 1
            if cache_rows == 0:
                continue
            if len(cache) >= cache_rows:
                cache.pop()
        cache.insert(0, x)
    return misses


# ---- kernels/sparse_update.py: distinct and coalesce -------------------------------------------------
def distinct(ids):
    """Distinct ids in first-occurrence order and each id's index into them, with a dict."""
    number = {}
    inverse = []
    for i in np.asarray(ids).reshape(-1).tolist():
        if i not in number:
            number[i] = len(number)
        inverse.append(number[i])
    return np.array(list(number), dtype=np.int64), np.array(inverse, dtype=np.int64)


def coalesce(ids, grads):
    """Distinct ids (first-occurrence order) and each one's gradient rows summed in float32, in input order."""
    uniq, inverse = distinct(ids)
    gsum = np.zeros((len(uniq), grads.shape[1]), dtype=np.float32)
    for j, k in enumerate(inverse):
        gsum[k] += grads[j]
    return uniq, gsum


def add_counts(ids, col_offset, counts, weight):
    """``counts[id + offset] += weight`` per lookup, the obvious way."""
    out = counts.copy()
    for row in np.asarray(ids):
        for c, v in enumerate(row):
            if v != -1:  # padding
                out[int(v) + int(col_offset[c])] += weight
    return out
