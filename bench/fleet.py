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

"""The streaming fleet: batching, routing and what a run costs (stdlib only).

form_batches plays the patched stateful batching DoFn over timed requests:
a state key's batch is emitted when it reaches the batch size (the runs use
min_batch_size == max_batch_size, so the size estimator plays no part) or
when its buffering timer, set at its first element's arrival plus the
buffering duration, fires. A timer due at or before an arrival fires first.

Routes say where a request goes: its state key and the worker that owns it.

* baseline_route: today's stateful BatchElements, keyed by a per-worker
  shared key, so a request is batched on the worker that read it.
* KeyedRoute: WithBatchKey. The state key is (str(key), shard); the shard
  comes from a picker given num_shards(key); a runner places state keys on
  workers by a stable hash (worker_of).
* OracleRoute: popularity-aware placement with the same caches and batch
  size (see its docstring).

evaluate replays every worker's batches, in the order they are emitted,
through its PrefixCache and counts its work: the prompt tokens it computes
plus a fixed overhead per batch and per further request of a batch, in
the same unit.
"""

import copy
import dataclasses
import hashlib
import heapq
import math
import random
import statistics
from collections import Counter
from collections.abc import Mapping

from bench.cache import PrefixCache
from bench.workloads import BLOCK_TOKENS
from bench.workloads import MICROS


@dataclasses.dataclass
class Batch:
  """A batch as its worker's server receives it."""
  worker: int
  state_key: object
  requests: list
  emitted_us: int = 0


def worker_of(state_key, workers: int) -> int:
  """Where a runner places a state key: a stable hash over the workers."""
  digest = hashlib.sha256(repr(state_key).encode()).digest()
  return int.from_bytes(digest[:8], 'big') % workers


def form_batches(requests, route, batch_size: int,
                 buffering_us: int) -> list[Batch]:
  """Batches as the stateful batching DoFn emits them, in emission order.

  Args:
    requests: Requests in arrival order.
    route: request -> (state key, worker).
    batch_size: min_batch_size == max_batch_size.
    buffering_us: max_batch_duration_secs, in microseconds.
  """
  if batch_size < 1:
    raise ValueError(f'batch_size must be positive, got {batch_size!r}')
  open_batches: dict = {}
  timers: list = []
  emitted: list[Batch] = []
  serial = 0

  def fire_until(now):
    while timers and timers[0][0] <= now:
      due, number, state_key = heapq.heappop(timers)
      batch = open_batches.get(state_key)
      if batch is not None and batch[0] == number:
        del open_batches[state_key]
        batch[1].emitted_us = due
        emitted.append(batch[1])

  for request in requests:
    fire_until(request.arrival_us)
    state_key, worker = route(request)
    batch = open_batches.get(state_key)
    if batch is None:
      serial += 1
      batch = open_batches[state_key] = (serial, Batch(worker, state_key, []))
      heapq.heappush(
          timers, (request.arrival_us + buffering_us, serial, state_key))
    batch[1].requests.append(request)
    if len(batch[1].requests) >= batch_size:
      del open_batches[state_key]
      batch[1].emitted_us = request.arrival_us
      emitted.append(batch[1])
  fire_until(math.inf)
  return emitted


def baseline_route(request):
  """Today's stateful BatchElements: one shared key per worker."""
  return ('shared', request.reader), request.reader


class RandomPicker:
  """WithBatchKey's rule: a shard drawn at random for each element (and no
  draw at all when the key has one shard)."""
  name = 'random'

  def __init__(self, seed):
    self._rng = random.Random(seed)

  def __call__(self, reader, key, count):
    return int(self._rng.random() * count) if count > 1 else 0


class StickyPicker:
  """Sends a run of `run` elements of a key to one shard before drawing the
  next, separately on every worker that reads the key."""
  name = 'sticky'

  def __init__(self, seed, run):
    self._rng = random.Random(seed)
    self._run = run
    self._current: dict = {}

  def __call__(self, reader, key, count):
    if count == 1:
      return 0
    shard, left = self._current.get((reader, key), (0, 0))
    if left == 0 or shard >= count:
      shard, left = self._rng.randrange(count), self._run
    self._current[(reader, key)] = (shard, left - 1)
    return shard


def fixed_shard_count(num_shards, key):
  """The shards that num_shards gives key when it is None (1), an int or a
  mapping (unlisted keys get 1); None when it is a callable, whose copies
  the caller keeps."""
  if num_shards is None:
    return 1
  if isinstance(num_shards, int):
    return num_shards
  if isinstance(num_shards, Mapping):
    return num_shards.get(key, 1)
  return None


class KeyedRoute:
  """WithBatchKey's routing, with num_shards as BatchElements takes it: None,
  an int, a mapping (unlisted keys get 1) or a callable. A callable is
  copied for every worker that reads requests, as a runner's workers each
  deserialize their own copy of the DoFn."""
  def __init__(self, num_shards, picker, workers: int):
    self._num_shards = num_shards
    self._picker = picker
    self._workers = workers
    self._copies: dict = {}
    self._placed: dict = {}

  def _count(self, request):
    spec = self._num_shards
    count = fixed_shard_count(spec, request.key)
    if count is not None:
      return count
    fn = self._copies.get(request.reader)
    if fn is None:
      fn = self._copies[request.reader] = copy.deepcopy(spec)
    return fn(request.key)

  def __call__(self, request):
    count = self._count(request)
    shard = self._picker(request.reader, request.key, count)
    state_key = (str(request.key), shard)
    worker = self._placed.get(state_key)
    if worker is None:
      worker = self._placed[state_key] = worker_of(state_key, self._workers)
    return state_key, worker


def traffic_shards(requests, workers: int) -> dict:
  """num_shards sized by each key's share of the run's traffic:
  ceil(share * workers), at least 1."""
  counts = Counter(r.key for r in requests)
  return {
      key: max(1, math.ceil(count / len(requests) * workers))
      for key, count in counts.items()
  }


class OracleRoute:
  """Popularity-aware placement that knows each span's traffic in advance.

  In every span of constant popularity (workload.epoch_of), a key gets
  ceil(count / (requests / workers)) replicas; replicas are placed largest
  first on the least-loaded workers (never two of one key on a worker), and
  a key's requests go to its replicas in turns of one batch. Keys seen once
  in a span share a per-worker state key on a least-loaded worker, so that
  unique prompts still fill batches.
  """
  def __init__(self, requests, workers: int, batch_size: int, epoch_of):
    self._batch_size = batch_size
    self._epoch_of = epoch_of
    spans: dict = {}
    for request in requests:
      spans.setdefault(epoch_of(request.rid), []).append(request)
    self._placement = {
        span: self._place(members, workers)
        for span, members in spans.items()
    }
    self._turns: Counter = Counter()

  @staticmethod
  def _place(requests, workers):
    counts = Counter(r.key for r in requests)
    fair = len(requests) / workers
    pieces = []
    for key, count in counts.items():
      replicas = min(workers, math.ceil(count / fair))
      pieces += [(count / replicas, key)] * replicas
    pieces.sort(key=lambda piece: -piece[0])
    heap = [(0.0, w) for w in range(workers)]
    placement: dict = {}
    for load, key in pieces:
      if counts[key] == 1:
        held = placement.setdefault(key, [])
        load_w, w = heapq.heappop(heap)
        held.append(w)
        heapq.heappush(heap, (load_w + load, w))
        continue
      skipped = []
      while True:
        load_w, w = heapq.heappop(heap)
        if w not in placement.get(key, ()):
          break
        skipped.append((load_w, w))
      placement.setdefault(key, []).append(w)
      heapq.heappush(heap, (load_w + load, w))
      for item in skipped:
        heapq.heappush(heap, item)
    return {
        key: (workers_of_key, counts[key] == 1)
        for key, workers_of_key in placement.items()
    }

  def __call__(self, request):
    span = self._epoch_of(request.rid)
    workers_of_key, unique = self._placement[span][request.key]
    if unique:
      return ('unique', workers_of_key[0]), workers_of_key[0]
    turn = self._turns[(span, request.key)]
    self._turns[(span, request.key)] += 1
    replica = (turn // self._batch_size) % len(workers_of_key)
    return (request.key, span, replica), workers_of_key[replica]


def percentile(values, q: float) -> float:
  """The q-th percentile (0..100), by linear interpolation."""
  ordered = sorted(values)
  if not ordered:
    raise ValueError('percentile of nothing')
  position = (len(ordered) - 1) * q / 100
  low = math.floor(position)
  high = min(low + 1, len(ordered) - 1)
  return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def evaluate(
    batches,
    workers: int,
    cache_blocks: int,
    overhead_tokens: float,
    request_overhead_tokens: float = 0.0) -> dict:
  """The figures of one run (see the module docstring). A batch of n
  requests costs overhead_tokens plus (n - 1) request_overhead_tokens on
  top of the tokens it computes."""
  hit_tokens = total_tokens = 0
  computed = [0] * workers
  batch_counts = [0] * workers
  extra = [0] * workers
  caches = [PrefixCache(cache_blocks) for _ in range(workers)]
  delays = []
  pure = 0
  for batch in sorted(batches, key=lambda b: b.emitted_us):
    cache = caches[batch.worker]
    for request in batch.requests:
      hits = cache.serve(request.segments)
      size = sum(count for _, count in request.segments)
      hit_tokens += hits * BLOCK_TOKENS
      total_tokens += size * BLOCK_TOKENS
      computed[batch.worker] += (size - hits) * BLOCK_TOKENS
      delays.append(batch.emitted_us - request.arrival_us)
    batch_counts[batch.worker] += 1
    extra[batch.worker] += len(batch.requests) - 1
    pure += len({r.key for r in batch.requests}) == 1
  work = [
      c + overhead_tokens * n + request_overhead_tokens * e
      for c, n, e in zip(computed, batch_counts, extra)
  ]
  return {
      'hit_rate': hit_tokens / total_tokens,
      'load_max_over_mean': max(work) / statistics.fmean(work),
      'busiest_worker_work': max(work),
      'prompt_tokens_computed': sum(computed),
      'p50_delay_s': percentile(delays, 50) / MICROS,
      'p99_delay_s': percentile(delays, 99) / MICROS,
      'mean_batch_size': len(delays) / len(batches),
      'purity': pure / len(batches),
      'requests': len(delays),
  }


def bound(requests) -> dict:
  """The loose bound: every distinct block computed once, fleet-wide, with
  no limit on cache size and no batching."""
  seen = {}
  total = 0
  for request in requests:
    for segment, count in request.segments:
      total += count
      seen[segment] = count
  return {'hit_rate': 1 - sum(seen.values()) / total}
