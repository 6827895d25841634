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

"""Benchmark v4's valid upper bound of a point (stdlib only).

The bound is a capacity that no strategy passes: the scored requests
compute only the prompt blocks that no strategy avoids (prefill), in full
batches at the engine's best rate, with no shuffle, and the busiest
worker does the mean work.

prefill counts those blocks in one of two ways.

* Without a cache limit (batch, whose runner may bring a prefix's requests
  together in any order): each shareable prefix is computed once for the
  fleet, and not at all if a request before t0 used it.
* Within the fleet's caches (streaming). deploy.evaluate serves a request
  when its batch is emitted, at most max_delay_us after it arrives. Take
  two uses of a prefix that arrive in turn more than max_delay_us apart:
  between the first one's latest service and the second one's arrival,
  every earlier use has been served and no later one has, so whichever
  later use is served first reuses the prefix only if a cache held it
  all that time. These holds belong to distinct uses and do not overlap;
  from t0 on they fit in workers x blocks cached blocks until the last
  arrival. Pooling the fleet's caches into one and letting a hold keep
  any fraction of a prefix only loosens that limit, under which the
  fewest blocks are computed by holding the shortest gaps first. No
  placement, serving order or eviction computes fewer, so the bound stays
  valid for every strategy whose requests wait at most max_delay_us
  (check_delays). Uses closer together than that need no hold of their
  own, and a prefix is reused only behind its cached leading segments,
  which the bound does not count; both only loosen it.
"""

import dataclasses
import math
from typing import Optional

from bench.deploy import BALANCED
from bench.deploy import CELL_US
from bench.deploy import SERIAL
from bench.deploy import WINDOWS
from bench.workloads import BLOCK_TOKENS
from bench.workloads import SEGMENT_KINDS
from bench.workloads import SHAREABLE


@dataclasses.dataclass(frozen=True)
class FleetCache:
  """The fleet's prefix caches, as the bound may use them.

  Attributes:
    workers: how many workers, each with its own cache.
    blocks: the blocks one worker's cache holds.
    max_delay_us: the longest any strategy holds a request before serving
      it (the buffering period).
  """
  workers: int
  blocks: int
  max_delay_us: int

  def __post_init__(self):
    for name in ('workers', 'blocks'):
      value = getattr(self, name)
      if value < 1:
        raise ValueError(f'{name} must be positive, got {value!r}')
    if self.max_delay_us < 0:
      raise ValueError(
          f'max_delay_us must not be negative, got {self.max_delay_us!r}')


@dataclasses.dataclass(frozen=True)
class Prefill:
  """The scored requests' prompt blocks, and a floor under those computed.

  Attributes:
    requests: how many requests are scored.
    computed: the blocks every strategy computes at least (fractional
      where the caches limit it).
    total: all their blocks.
  """
  requests: int
  computed: float
  total: int

  @property
  def hit_rate(self) -> float:
    return 1 - self.computed / self.total if self.total else 0.0


def prefill(
    requests,
    t0_cell: int,
    cache: Optional[FleetCache] = None,
    cell_us: int = CELL_US) -> Prefill:
  """The blocks of the requests arriving from t0_cell on, and the floor
  under those computed, with no cache limit or within the fleet's caches
  (see the module docstring)."""
  t0_us = t0_cell * cell_us
  uses: dict = {}
  scored = total = computed = 0
  last_us = 0
  for request in requests:
    counted = request.arrival_us // cell_us >= t0_cell
    scored += counted
    last_us = max(last_us, request.arrival_us)
    for seg, count in request.segments:
      if counted:
        total += count
      if seg // SEGMENT_KINDS in SHAREABLE:
        uses.setdefault(seg, []).append((request.arrival_us, count, counted))
      elif counted:
        computed += count
  holds = []
  for seg_uses in uses.values():
    seg_uses.sort(key=lambda use: use[0])
    if seg_uses[0][2]:
      # Whichever of its requests is served first computes the prefix.
      computed += seg_uses[0][1]
    if cache is not None:
      holds.extend(_holds(seg_uses, t0_us, cache.max_delay_us))
  if cache is None or not holds:
    return Prefill(scored, float(computed), total)
  budget = cache.workers * cache.blocks * float(last_us - t0_us)
  fewest = float(computed)
  for length_us, count in sorted(holds):
    cost = length_us * count
    if cost <= budget:
      budget -= cost
      continue
    # Hold what the budget has left of this gap, compute the rest.
    fewest += count - budget / length_us
    budget = 0.0
  return Prefill(scored, fewest, total)


def _holds(seg_uses, t0_us, max_delay_us):
  """(the hold from t0 on, in us, blocks) that each gap between one
  prefix's uses (in arrival order) asks of the later use served first,
  for the gaps that end at a scored use."""
  for i in range(1, len(seg_uses)):
    at_us, count, counted = seg_uses[i]
    if not counted:
      continue
    length_us = at_us - max(seg_uses[i - 1][0] + max_delay_us, t0_us)
    if length_us > 0:
      yield length_us, count


def check_delays(runs, max_delay_us: int):
  """Raises ValueError if a run's request waited longer than max_delay_us,
  which would leave the bound within the fleet's caches invalid."""
  for run in runs:
    longest = max((delay for _, delay in run.delays), default=0)
    if longest > max_delay_us:
      raise ValueError(
          f'a request waited {longest} us, more than the bound allows '
          f'(max_delay_us={max_delay_us!r})')


def bound(
    prefill_blocks: Prefill,
    decode_tokens,
    model,
    workers,
    batch_size,
    shuffles=0,
    in_flight=None) -> dict:
  """The bound's capacity over prefill_blocks (prefill), the same for
  every window size, spread evenly and with each state key's batches run
  one at a time (deploy.SERIAL: a strategy with enough state keys has
  every DoFn thread in flight).

  With shuffles, each request also pays that many element shuffles: the
  bound of every strategy that shuffles each element as often. in_flight
  is the most requests a worker's DoFn threads can have in flight (their
  count times batch_size, at most max_num_seqs, the default): the engine
  runs at its rate there, which no strategy passes.
  """
  if in_flight is None:
    in_flight = model.max_num_seqs
  per_request = (
      model.batch_overhead(batch_size) / batch_size +
      decode_tokens * model.decode_token_tokens /
      model.efficiency(in_flight, model.decode_half) +
      shuffles * model.shuffle_tokens)
  work = (
      prefill_blocks.computed * BLOCK_TOKENS /
      model.efficiency(in_flight, model.prefill_half) +
      prefill_blocks.requests * per_request)
  capacity = (prefill_blocks.requests / (work / workers) if work else math.inf)
  return {
      'capacity': {
          name: capacity
          for name in (*WINDOWS, BALANCED, SERIAL)
      },
      'requests': prefill_blocks.requests,
      'hit_rate': prefill_blocks.hit_rate,
      'mean_batch_size': float(batch_size),
  }
