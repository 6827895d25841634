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

"""Benchmark v4's deployments: placing, serving and scoring batches
(stdlib only).

Placement (a placer maps a state key to a worker at a time):

* HashPlacer: a static salted hash (streaming_F2).
* RangePlacer: contiguous ranges of hashed positions, re-cut every
  window_us on the work measured so far (decayed), never on what is yet to
  come (streaming_F3).
* StaticPlacer: a fixed map (the batch deployment's ranges, `lpt`, the
  reading worker).

evaluate serves every batch, in emission order, through its worker's
prefix cache and counts each request's work into cells: (worker, 2 s
window of the batch's emission, 2 s window of the request's arrival). A
request is scored when it arrives at or after t0, so every strategy at a
point scores the same requests. score turns the cells into capacity:
scored requests over the sum, over windows, of each window's busiest
worker's work. The batch deployment puts every batch in one cell, so its
capacity is the makespan's. score also gives capacity[BALANCED]: the
scored requests over the mean worker's work, as if every window's work
were spread evenly (the bound's balance) with the cache hits the run's
placement gave. It approximately parts a strategy's gap to the bound
into imbalance between the workers (within windows and over the whole
run alike) and the rest. And it gives capacity[SERIAL]: over 10 s windows,
with each state key's batches run one at a time, as Dataflow and Prism run
a key's work (key_caps); the other figures let every DoFn thread of a
worker have a batch in flight, whatever its state keys.

bench/bound.py gives the valid upper bound of a point.
"""

import bisect
import dataclasses
from collections.abc import Mapping
from typing import Optional

from bench.cache import PrefixCache
from bench.fleet import percentile
from bench.frames import cut_ranges
from bench.frames import position
from bench.workloads import BLOCK_TOKENS
from bench.workloads import MICROS
from bench.workloads import SEGMENT_KINDS
from bench.workloads import SHAREABLE

CELL_US = 2 * MICROS
# The capacity of a run whose work every window spreads evenly over the
# workers (score, bound).
BALANCED = 'balanced'
# The capacity over 10 s windows with each state key's batches run one at a
# time (score's serial_batch).
SERIAL = '10s_serial'
# The window, in cells, over which score's serial_batch weighs each state key's
# share of a worker's requests.
KEY_WINDOW_CELLS = 5
# Scoring windows, in cells (None: the whole run).
WINDOWS = {'2s': 1, '10s': 5, '60s': 30, 'whole': None}
# How often a range placer (streaming_F3) re-cuts its key ranges.
RANGE_RECUT_US = 10 * MICROS
SPACE = 2**64


class HashPlacer:
  def __init__(self, workers, salt):
    self._workers = workers
    self._salt = salt
    self._placed: dict = {}

  def __call__(self, state_key, now_us):
    worker = self._placed.get(state_key)
    if worker is None:
      worker = self._placed[state_key] = (
          position(state_key, self._salt) % self._workers)
    return worker

  def observe(self, state_key, work, now_us):
    pass


class StaticPlacer:
  """A fixed map; keys not in it (a first stage's) are hashed."""
  def __init__(self, placement, workers, salt=''):
    self._placement = placement
    self._hash = HashPlacer(workers, salt)

  def __call__(self, state_key, now_us):
    worker = self._placement.get(state_key)
    if worker is None:
      return self._hash(state_key, now_us)
    return worker

  def observe(self, state_key, work, now_us):
    pass


class RangePlacer:
  """Key ranges re-cut every window_us by the work measured so far, each
  window's work decayed by `decay` per window after it."""
  def __init__(self, workers, salt, window_us=RANGE_RECUT_US, decay=0.5):
    self._workers = workers
    self._salt = salt
    self._window_us = window_us
    self._decay = decay
    self._cuts = [SPACE * (i + 1) // workers for i in range(workers - 1)]
    self._positions: dict = {}
    self._work: dict = {}
    self._next_us = window_us
    self._where: dict = {}
    self.recuts = 0

  def _position(self, state_key):
    at = self._positions.get(state_key)
    if at is None:
      at = self._positions[state_key] = position(state_key, self._salt)
    return at

  def __call__(self, state_key, now_us):
    if now_us >= self._next_us:
      self._recut()
      self._next_us = (now_us // self._window_us + 1) * self._window_us
    worker = self._where.get(state_key)
    if worker is None:
      worker = self._where[state_key] = bisect.bisect_right(
          self._cuts, self._position(state_key))
    return worker

  def observe(self, state_key, work, now_us):
    self._work[state_key] = self._work.get(state_key, 0.0) + work

  def _recut(self):
    ordered = sorted(self._work, key=self._position)
    if len(ordered) < 2:
      return
    runs = cut_ranges([self._work[k] for k in ordered], self._workers)
    cuts = []
    for i in range(1, len(ordered)):
      if runs[i] != runs[i - 1]:
        cuts.append(
            (self._position(ordered[i - 1]) + self._position(ordered[i])) // 2)
    while len(cuts) < self._workers - 1:
      cuts.append(SPACE)
    self._cuts = cuts
    self._where = {}
    self._work = {k: v * self._decay for k, v in self._work.items()}
    self.recuts += 1


@dataclasses.dataclass(frozen=True)
class Charges:
  """What a strategy's requests cost beyond serving.

  Attributes:
    shuffles: shuffles per element, on the batch's worker.
    first_stage: whether each element also pays a shuffle on the worker of
      its key's first stage (the two-stage policy's measuring step).
    first_stage_spread: how many measuring keys a key's first stage is
      spread over, each request to one by its id (1: the key's own, as
      0013's measuring step is keyed; more is a design bench/RESEARCH.md
      weighs).
    first_stage_of: rid -> the measuring shard of a request's key (0013's
      on bounded input in a batch pipeline; batch.measuring_shards); none:
      0 for every request.
  """
  shuffles: int = 1
  first_stage: bool = False
  first_stage_spread: int = 1
  first_stage_of: Optional[Mapping] = None

  def __post_init__(self):
    if self.first_stage_spread < 1:
      raise ValueError(
          'first_stage_spread must be at least 1, got '
          f'{self.first_stage_spread!r}')


class Run:
  """The cells of one evaluation."""
  def __init__(self, workers, cache_blocks):
    self.workers = workers
    self.cache_blocks = cache_blocks
    # (worker, emission cell) -> [batches, requests]
    self.shape: dict = {}
    # (worker, emission cell) -> {state key: its requests emitted there}
    self.keys: dict = {}
    # (worker, emission cell, arrival cell) ->
    #   [prefill tokens, overhead, requests, shuffles, hit tokens, tokens]
    self.cells: dict = {}
    self.delays: list = []
    self.evicted_at: list = [None] * workers
    self.first_served: list = [{} for _ in range(workers)]
    self.by_key: dict = {}
    self.end_us = 0

  def add(self, worker, emitted, arrived, values):
    cell = self.cells.get((worker, emitted, arrived))
    if cell is None:
      cell = self.cells[(worker, emitted, arrived)] = [0.0] * 6
    for i, v in enumerate(values):
      cell[i] += v


def evaluate(
    batches,
    placer,
    workers: int,
    cache_blocks: int,
    model,
    charges: Charges,
    measure_decode: int = 0,
    track_prefixes: bool = False,
    cell_us: int = CELL_US) -> Run:
  """Serves the batches (see the module docstring). measure_decode: the
  decode length whose work the placer measures."""
  run = Run(workers, cache_blocks)
  caches = [PrefixCache(cache_blocks) for _ in range(workers)]
  per_request = (
      measure_decode * model.decode_token_tokens +
      charges.shuffles * model.shuffle_tokens)
  shape_of = run.shape
  delays = run.delays
  for batch in sorted(batches, key=lambda b: b.emitted_us):
    now = batch.emitted_us
    worker = placer(batch.state_key, now)
    cache = caches[worker]
    emitted = now // cell_us
    n = len(batch.requests)
    shape = shape_of.get((worker, emitted))
    if shape is None:
      shape = shape_of[(worker, emitted)] = [0, 0]
    shape[0] += 1
    shape[1] += n
    emitting = run.keys.setdefault((worker, emitted), {})
    emitting[batch.state_key] = emitting.get(batch.state_key, 0) + n
    overhead = model.batch_overhead(n) / n
    computed_total = 0
    by_arrival: dict = {}
    firsts: dict = {}
    for request in batch.requests:
      hits = cache.serve(request.segments)
      size = 0
      for _, count in request.segments:
        size += count
      computed = (size - hits) * BLOCK_TOKENS
      computed_total += computed
      arrived = request.arrival_us // cell_us
      cell = by_arrival.get(arrived)
      if cell is None:
        cell = by_arrival[arrived] = [0, 0, 0, 0]
      cell[0] += computed
      cell[1] += hits
      cell[2] += size
      cell[3] += 1
      delays.append((arrived, now - request.arrival_us))
      if charges.first_stage:
        spread = charges.first_stage_spread
        part = request.rid % spread if spread > 1 else ((
            charges.first_stage_of or {}).get(request.rid, 0))
        first = ('stage1',
                 request.key) if part == 0 else ('stage1', request.key, part)
        at = (placer(first, now), arrived)
        firsts[at] = firsts.get(at, 0) + 1
        placer.observe(first, model.shuffle_tokens, now)
      if track_prefixes:
        served = run.first_served[worker]
        for seg, _ in request.segments:
          if seg // SEGMENT_KINDS in SHAREABLE:
            seen = served.get(seg)
            served[seg] = (now, 1) if seen is None else (seen[0], seen[1] + 1)
    for (first_worker, arrived), k in firsts.items():
      run.add(first_worker, emitted, arrived, (0, 0, 0, k, 0, 0))
    for arrived, (computed, hits, size, k) in by_arrival.items():
      run.add(
          worker,
          emitted,
          arrived,
          (
              computed,
              overhead * k,
              k,
              charges.shuffles * k,
              hits * BLOCK_TOKENS,
              size * BLOCK_TOKENS))
    work = computed_total + overhead * n + per_request * n
    placer.observe(batch.state_key, work, now)
    run.by_key[batch.state_key] = run.by_key.get(batch.state_key, 0.0) + work
    if run.evicted_at[worker] is None and cache.evicted >= cache_blocks:
      run.evicted_at[worker] = now
    run.end_us = max(run.end_us, now)
  return run


def warm_time(run: Run, holds: bool):
  """When every worker of the run is warm (None: one never is): it has
  evicted one cache of blocks (holds False), or served every shareable
  prefix that carries 99% of its traffic (holds True)."""
  times = []
  for worker in range(run.workers):
    if holds:
      served = run.first_served[worker]
      if not served:
        continue
      total = sum(count for _, count in served.values())
      covered, last = 0, 0
      for first, count in sorted(served.values(), key=lambda v: -v[1]):
        if covered >= 0.99 * total:
          break
        covered += count
        last = max(last, first)
      times.append(last)
    else:
      if run.evicted_at[worker] is None:
        if any(k[0] == worker for k in run.shape):
          return None
        continue
      times.append(run.evicted_at[worker])
  return max(times, default=0)


def _work(run, t0_cell, decode_tokens, model, copies, caps) -> dict:
  """(worker, emission cell) -> the work of its requests that arrive from
  t0_cell on, with at most caps[(worker, key window)] requests in flight
  (empty caps: every DoFn thread's batch)."""
  work: dict = {}
  for (worker, emitted, arrived), cell in run.cells.items():
    if arrived < t0_cell:
      continue
    shape = run.shape.get((worker, emitted))
    # A cell without batches holds first-stage shuffles only.
    in_flight = (
        model.in_flight(copies, shape[1] /
                        shape[0]) if shape else model.max_num_seqs)
    if caps and shape:
      in_flight = min(in_flight, caps[(worker, emitted // KEY_WINDOW_CELLS)])
    w = model.work(cell[0], cell[2], cell[1], cell[3], decode_tokens, in_flight)
    work[(worker, emitted)] = work.get((worker, emitted), 0.0) + w
  return work


def _capacity(work: dict, cells, requests_scored: int) -> float:
  """Scored requests over the sum of every window's (of `cells` cells;
  None: the whole run) busiest worker's work."""
  windows: dict = {}
  for (worker, emitted), w in work.items():
    at = (emitted // cells if cells else 0, worker)
    windows[at] = windows.get(at, 0.0) + w
  busiest: dict = {}
  for (window, _), w in windows.items():
    busiest[window] = max(busiest.get(window, 0.0), w)
  return requests_scored / sum(busiest.values())


def score(
    run: Run,
    t0_cell: int,
    decode_tokens: int,
    model,
    copies: int,
    requests_scored: int,
    serial_batch: Optional[int] = None) -> dict:
  """Capacity (scored requests over the sum of every window's busiest
  worker's work) per window size, capacity[BALANCED] (over the mean
  worker's work), and the scored requests' figures.

  Each state key's batches run one at a time, as runners process a key's
  work serially; a saturated worker then has at most a full batch over the
  busiest state key's share of its requests in flight (key_caps).
  serial_batch: the batch size; capacity[SERIAL] is the capacity over
  10 s windows under that limit (none: no such figure). The other figures
  let every DoFn thread have a batch in flight.
  """
  work = _work(run, t0_cell, decode_tokens, model, copies, {})
  hits = tokens = 0.0
  for (worker, emitted, arrived), cell in run.cells.items():
    if arrived >= t0_cell:
      hits += cell[4]
      tokens += cell[5]
  capacities = {
      name: _capacity(work, cells, requests_scored)
      for name, cells in WINDOWS.items()
  }
  capacities[BALANCED] = requests_scored / (sum(work.values()) / run.workers)
  if serial_batch:
    capacities[SERIAL] = _capacity(
        _work(
            run,
            t0_cell,
            decode_tokens,
            model,
            copies,
            key_caps(run, serial_batch)),
        WINDOWS['10s'],
        requests_scored)
  scored_batches = scored_requests = 0
  for (worker, emitted), (batches, requests) in run.shape.items():
    if emitted >= t0_cell:
      scored_batches += batches
      scored_requests += requests
  delays = [d for a, d in run.delays if a >= t0_cell]
  return {
      'capacity': capacities,
      'hit_rate': hits / tokens if tokens else 0.0,
      'mean_batch_size': (
          scored_requests / scored_batches if scored_batches else 0.0),
      'p99_delay_s': percentile(delays, 99) / MICROS if delays else 0.0,
  }


# The capacity scored over 10 s windows from the run's start, cold caches
# included, beside the steady state's (streaming only: batch scores the
# whole job from its start).
FROM_START = '10s_from_start'


def key_caps(run: Run, per_key: int) -> dict:
  """(worker, KEY_WINDOW_CELLS window) -> the requests a saturated worker
  can have in flight when each state key runs one batch of per_key
  requests at a time. With n requests in flight the engine serves r(n) a
  second, so a batch takes n / r(n) seconds (Little's law) and a key serves
  at most per_key * r(n) / n a second. A key that carries a share f of the
  worker's requests keeps up only while f <= per_key / n: the busiest key's
  share bounds n. The cap counts a full batch per key, but the work keeps
  the run's batches as they were formed (their overheads and cache hits),
  where a saturated key's backlog would fill them."""
  counts: dict = {}
  for (worker, emitted), keys in run.keys.items():
    merged = counts.setdefault((worker, emitted // KEY_WINDOW_CELLS), {})
    for key, n in keys.items():
      merged[key] = merged.get(key, 0) + n
  return {
      at: per_key * sum(c.values()) / max(c.values())
      for at, c in counts.items()
  }


def scored_requests(requests, t0_cell: int) -> int:
  """How many of the requests arrive from t0_cell on."""
  return sum(1 for r in requests if r.arrival_us // CELL_US >= t0_cell)


def score_with_start(
    run: Run,
    *,
    t0_cell: int,
    decode_tokens: int,
    model,
    copies: int,
    requests_scored: int,
    requests_total: int,
    serial_batch: Optional[int] = None) -> dict:
  """score from t0_cell, with capacity[FROM_START] from the run's start
  (requests_scored: those from t0_cell on; requests_total: all)."""
  figures = score(
      run,
      t0_cell,
      decode_tokens,
      model,
      copies,
      requests_scored,
      serial_batch=serial_batch)
  start = figures if t0_cell == 0 else score(
      run, 0, decode_tokens, model, copies, requests_total)
  figures['capacity'][FROM_START] = start['capacity']['10s']
  return figures
