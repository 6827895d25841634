#
# Licensed to the Apache Software Foundation (ASF) under one or more
# contributor license agreements.  See the NOTICE file distributed with
# this work for additional information regarding copyright ownership.
# The ASF licenses this file to You under the Apache License, Version 2.0
# (the "License"); you may not use this file except in compliance with
# the License.  You may obtain a copy of the License at
#
#    http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#

"""Benchmark v3's fleet: DoFn copies, placement frames, costs (stdlib only).

A Beam worker runs P SDK processes of T threads each, and every thread runs
its own deserialized copy of a step's DoFns: P x T copies per worker. A
request is read by one copy (copy_of). Batching assigns every request a
state key (a route, as in fleet.form_batches); the runner then places the
state keys on workers, and each worker serves the batches of its state keys
in the order they are emitted.

Placement is the same for every strategy of a frame, the baseline
included:

* F1, the committed frame: the baseline batches on the worker that read
  the request (one shared key per worker); keyed state keys are hashed.
* F2: every state key is hashed onto a worker with a salt (a runner that
  places keys by a static hash). Today's stateful BatchElements keys by a
  per-process UUID, so its P keys per worker are hashed too.
* F3: every state key is hashed to a position, and the workers own
  contiguous ranges of positions, cut so that the ranges' measured work is
  balanced (Dataflow streaming assigns key ranges and moves them). The
  work is first measured in a run placed by hash; the ranges are then cut
  again REBALANCES times, each time by the mean work measured so far.

The salt stands for everything that differs between two runs of a
pipeline: the UUIDs of the baseline, the runner's hash seed.

A worker's work is the prompt tokens it computes plus per-batch and
per-request overheads and the decode cost of its requests, all in prompt
token equivalents (Costs).
"""

import dataclasses
import hashlib
import random
import statistics
from collections import Counter

from bench.cache import PrefixCache
from bench.fleet import Batch
from bench.fleet import percentile
from bench.workloads import BLOCK_TOKENS
from bench.workloads import MICROS


@dataclasses.dataclass(frozen=True)
class Frame:
  """How the runner places state keys, and how many DoFn copies a worker
  runs (processes x threads)."""
  name: str
  placement: str  # 'hash' or 'ranges'
  processes: int
  threads: int
  # F1 only: the baseline batches where it reads.
  baseline_on_reader: bool = False

  @property
  def copies_per_worker(self) -> int:
    return self.processes * self.threads

  def describe(self) -> dict:
    return dataclasses.asdict(self)


# Dataflow runs 12 harness threads per Python SDK process in streaming.
THREADS = 12
F1 = Frame('F1', 'hash', 8, THREADS, baseline_on_reader=True)
F2 = Frame('F2', 'hash', 8, THREADS)
F2_P16 = Frame('F2_P16', 'hash', 16, THREADS)
F2_P32 = Frame('F2_P32', 'hash', 32, THREADS)
F3 = Frame('F3', 'ranges', 8, THREADS)
FRAMES = (F1, F2, F2_P16, F2_P32, F3)


@dataclasses.dataclass(frozen=True)
class Costs:
  """A worker's work, in prompt-token equivalents: per batch, per further
  request of a batch, and per decoded token of a request. Decoding is
  counted per request and token, as an engine with continuous batching
  shares its decode steps among every sequence in flight."""
  batch_tokens: float
  request_tokens: float
  decode_tokens: int = 0
  decode_token_cost: float = 0.0

  @property
  def per_request_decode(self) -> float:
    return self.decode_tokens * self.decode_token_cost


def copy_of(requests, frame: Frame, seed) -> list:
  """The (worker, process, thread) that reads each request: its reader
  worker, and one of the worker's copies drawn uniformly."""
  rng = random.Random(f'{seed}/copies/{frame.processes}x{frame.threads}')
  out = [None] * (max(r.rid for r in requests) + 1 if requests else 0)
  for r in requests:
    out[r.rid] = (
        r.reader, rng.randrange(frame.processes), rng.randrange(frame.threads))
  return out


def position(state_key, salt) -> int:
  """A state key's place in the runner's hash space (64 bits)."""
  digest = hashlib.sha256(f'{salt}/{state_key!r}'.encode()).digest()
  return int.from_bytes(digest[:8], 'big')


def hash_placement(state_keys, workers: int, salt) -> dict:
  return {k: position(k, salt) % workers for k in state_keys}


def cut_ranges(works, workers: int) -> list:
  """Cuts a sequence of works into at most `workers` contiguous runs with
  the smallest possible largest sum; returns each item's run index."""
  if not works:
    return []
  low, high = max(works), sum(works)
  if high <= 0:
    return [0] * len(works)

  def runs_within(limit):
    runs, total = 1, 0.0
    for w in works:
      if total + w > limit:
        runs, total = runs + 1, 0.0
      total += w
    return runs

  for _ in range(60):
    if high - low <= 1e-6 * max(1.0, high):
      break
    middle = (low + high) / 2
    if runs_within(middle) <= workers:
      high = middle
    else:
      low = middle
  out, run, total = [], 0, 0.0
  for w in works:
    if total + w > high and total > 0:
      run, total = run + 1, 0.0
    total += w
    out.append(run)
  return out


def range_placement(work: dict, workers: int, salt) -> dict:
  """Contiguous ranges of hash positions, balanced by measured work."""
  ordered = sorted(work, key=lambda k: position(k, salt))
  runs = cut_ranges([work[k] for k in ordered], workers)
  return dict(zip(ordered, runs))


def lpt_placement(work: dict, workers: int, apart=None) -> dict:
  """Longest processing time first: every state key, heaviest first, to
  the least-loaded worker. apart(state_key) names a group whose members
  go to different workers while there are workers left."""
  loads = [0.0] * workers
  groups: dict = {}
  out = {}
  for k in sorted(work, key=lambda k: (-work[k], repr(k))):
    group = apart(k) if apart else None
    taken = groups.setdefault(group, set()) if group is not None else set()
    free = [w for w in range(workers) if w not in taken] or range(workers)
    w = min(free, key=lambda w: (loads[w], w))
    loads[w] += work[k]
    out[k] = w
    taken.add(w)
  return out


def evaluate(
    batches, placement: dict, workers: int, cache_blocks: int,
    costs: Costs) -> dict:
  """Serves every worker's batches in emission order through its prefix
  cache; returns the run's figures, the work of every state key
  (work_by_key) and the placement."""
  hit_tokens = total_tokens = 0
  work = [0.0] * workers
  computed_total = 0
  caches = [PrefixCache(cache_blocks) for _ in range(workers)]
  delays = []
  pure = 0
  by_key: dict = {}
  decode = costs.per_request_decode
  for batch in sorted(batches, key=lambda b: b.emitted_us):
    worker = placement[batch.state_key]
    cache = caches[worker]
    computed = 0
    for request in batch.requests:
      hits = cache.serve(request.segments)
      size = sum(count for _, count in request.segments)
      hit_tokens += hits * BLOCK_TOKENS
      total_tokens += size * BLOCK_TOKENS
      computed += (size - hits) * BLOCK_TOKENS
      delays.append(batch.emitted_us - request.arrival_us)
    n = len(batch.requests)
    cost = (
        computed + costs.batch_tokens + costs.request_tokens * (n - 1) +
        decode * n)
    computed_total += computed
    work[worker] += cost
    by_key[batch.state_key] = by_key.get(batch.state_key, 0.0) + cost
    pure += len({r.key for r in batch.requests}) == 1
  return {
      'hit_rate': hit_tokens / total_tokens,
      'load_max_over_mean': max(work) / statistics.fmean(work),
      'busiest_worker_work': max(work),
      'prompt_tokens_computed': computed_total,
      'p50_delay_s': percentile(delays, 50) / MICROS,
      'p99_delay_s': percentile(delays, 99) / MICROS,
      'mean_batch_size': len(delays) / len(batches),
      'purity': pure / len(batches),
      'requests': len(delays),
      'state_keys': len(by_key),
      'work_by_key': by_key,
      'placement': placement,
  }


def place_and_evaluate(
    batches,
    frame: Frame,
    salt,
    workers: int,
    cache_blocks: int,
    costs: Costs,
    on_reader: bool = False) -> dict:
  """A strategy's figures in a frame for one placement salt. on_reader:
  the state keys are ('shared', worker) keys batched where they are read
  (F1's baseline)."""
  keys = list(dict.fromkeys(b.state_key for b in batches))
  if on_reader:
    placement = {k: k[1] for k in keys}
    return evaluate(batches, placement, workers, cache_blocks, costs)
  placement = hash_placement(keys, workers, salt)
  figures = evaluate(batches, placement, workers, cache_blocks, costs)
  if frame.placement == 'hash':
    return figures
  return rebalance(
      batches,
      figures, lambda work: range_placement(work, workers, salt),
      workers,
      cache_blocks,
      costs)


# How many times F3's runner (and the LPT oracle) re-places the state keys
# by the work measured so far.
REBALANCES = 5


def rebalance(batches, figures, place, workers, cache_blocks, costs):
  """Re-places the state keys REBALANCES times, each time by the mean of
  every key's work as measured in the placements so far (a key's work
  depends on what shares its worker's cache, so a single measurement
  makes the placement oscillate); returns the last placement's figures."""
  measured = {k: [v] for k, v in figures['work_by_key'].items()}
  for _ in range(REBALANCES):
    placement = place({k: sum(v) / len(v) for k, v in measured.items()})
    figures = evaluate(batches, placement, workers, cache_blocks, costs)
    for k, v in figures['work_by_key'].items():
      measured[k].append(v)
  return figures


def lpt_evaluate(
    batches, workers: int, cache_blocks: int, costs: Costs, apart=None) -> dict:
  """The batches placed by LPT over their measured work: measured first
  with the state keys placed by LPT over their request counts, then
  rebalanced as F3 is."""
  work = Counter()
  for b in batches:
    work[b.state_key] += len(b.requests)
  placement = lpt_placement(dict(work), workers, apart)
  figures = evaluate(batches, placement, workers, cache_blocks, costs)
  return rebalance(
      batches,
      figures, lambda measured: lpt_placement(measured, workers, apart),
      workers,
      cache_blocks,
      costs)


def bundle_batches(requests, copies, batch_size: int, bundle_us: int) -> list:
  """The stateless per-bundle path: each copy batches what it reads in one
  bundle (bundle_us long, from its first element, or batch_size elements),
  on the worker that read it."""
  open_: dict = {}
  out = []
  for r in requests:
    copy = copies[r.rid]
    batch = open_.get(copy)
    if batch is not None and r.arrival_us - batch[0] >= bundle_us:
      batch[1].emitted_us = batch[0] + bundle_us
      out.append(batch[1])
      batch = None
    if batch is None:
      batch = open_[copy] = (r.arrival_us, Batch(copy[0], ('bundle', copy), []))
    batch[1].requests.append(r)
    if len(batch[1].requests) >= batch_size:
      batch[1].emitted_us = r.arrival_us
      out.append(batch[1])
      del open_[copy]
  for start, batch in open_.values():
    batch.emitted_us = start + bundle_us
    out.append(batch)
  return out


def median_index(values) -> int:
  """The index of the run whose value is the (lower) median."""
  order = sorted(range(len(values)), key=lambda i: values[i])
  return order[(len(order) - 1) // 2]
