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

"""Tests of benchmark v4's valid upper bound."""

import dataclasses
import random

import pytest

from bench import bound
from bench import deploy
from bench import fleet
from bench.deploy_test import FREE
from bench.deploy_test import shared_request
from bench.fleet_test import SECOND
from bench.fleet_test import request
from bench.workloads import BLOCK_TOKENS
from bench.workloads import SHARED
from bench.workloads import SUFFIX
from bench.workloads import SYSTEM
from bench.workloads import segment


def _capacity(blocks, *args, **kwargs):
  return bound.bound(blocks, *args, **kwargs)['capacity']['10s']


def test_without_a_cache_limit_each_prefix_is_computed_once_per_fleet():
  requests = [shared_request(i, 0.1 * i, i % 2) for i in range(10)]
  blocks = bound.prefill(requests, 0)
  assert blocks.computed == 2 * 4 + 10 * 1
  top = bound.bound(blocks, 0, FREE, 2, 8)
  work = (2 * 4 + 10 * 1) * BLOCK_TOKENS
  assert top['capacity']['10s'] == pytest.approx(10 / (work / 2))
  assert top['capacity'][deploy.BALANCED] == top['capacity']['10s']
  assert top['hit_rate'] == pytest.approx(1 - 18 / 50)
  # Two shuffles per request lower it by what they cost.
  shuffling = dataclasses.replace(FREE, shuffle_tokens=3.0)
  work += 10 * 2 * 3.0
  assert _capacity(
      blocks, 0, shuffling, 2, 8, shuffles=2) == pytest.approx(10 / (work / 2))
  # A prefix computed before t0 is not charged again: scored from the
  # second second on, the late requests pay for their own suffixes only.
  again = [shared_request(10 + i, 1.5 + 0.1 * i, i % 2) for i in range(10)]
  late = bound.prefill(requests + again, 1, cell_us=SECOND)
  assert (late.requests, late.computed) == (10, 10)
  assert _capacity(late, 0, FREE, 2,
                   8) == pytest.approx(10 / (10 * BLOCK_TOKENS / 2))


def test_the_bound_runs_the_engine_at_the_most_requests_in_flight():
  model = dataclasses.replace(FREE, prefill_half=4.0, decode_half=48.0)
  requests = [shared_request(i, 0.1 * i, i % 2) for i in range(10)]
  blocks = bound.prefill(requests, 0)
  top = _capacity(blocks, 16, model, 2, 8)
  # Workers of 16 DoFn threads hold at most 128 requests, where the engine
  # computes a prompt token and a decoded one more slowly than at 256.
  capped = _capacity(blocks, 16, model, 2, 8, in_flight=128)
  prefill = (2 * 4 + 10 * 1) * BLOCK_TOKENS
  work = (
      prefill / model.efficiency(128, 4.0) +
      10 * 16 / model.efficiency(128, 48.0))
  assert capped == pytest.approx(10 / (work / 2))
  assert capped < top
  assert top == pytest.approx(10 / ((prefill + 10 * 16) / 2))


def test_gaps_beyond_the_fleets_caches_are_computed_again():
  # A 4-block prefix used every 10 s by one worker whose cache holds 1
  # block: over the 20 s to serve, the cache holds 20 block-seconds, half
  # of one 10 s gap of 4 blocks.
  requests = [shared_request(i, 10.0 * i, 0) for i in range(3)]
  cache = bound.FleetCache(workers=1, blocks=1, max_delay_us=0)
  blocks = bound.prefill(requests, 0, cache)
  assert blocks.computed == pytest.approx(3 + 4 + 2 + 4)
  # Without the limit, only the first use computes the prefix.
  assert bound.prefill(requests, 0).computed == 3 + 4
  # Two workers' caches hold one gap, four hold both.
  two = dataclasses.replace(cache, workers=2)
  assert bound.prefill(requests, 0, two).computed == 3 + 4 + 4
  four = dataclasses.replace(cache, workers=4)
  assert bound.prefill(requests, 0, four).computed == 3 + 4


def test_the_shortest_gaps_are_held_first():
  # Prefix 0 is reused after 2 s, prefix 1 after 16 s (each 4 blocks);
  # 18 s at 1 block hold 18 block-seconds: prefix 0's gap (8) and 10 of
  # prefix 1's 64.
  requests = [
      shared_request(0, 0.0, 1),
      shared_request(1, 16.0, 0),
      shared_request(2, 16.0, 1),
      shared_request(3, 18.0, 0),
  ]
  cache = bound.FleetCache(workers=1, blocks=1, max_delay_us=0)
  blocks = bound.prefill(requests, 0, cache)
  assert blocks.computed == pytest.approx(4 + 2 * 4 + 4 - 10 / 16)


def test_a_hold_is_shortened_by_the_delay():
  # Requests may wait 1 s: a reuse 0.5 s after the other use may share its
  # batch, and one 3 s after it holds the prefix for 2 s.
  requests = [
      shared_request(0, 0.0, 0),
      shared_request(1, 0.5, 0),
      shared_request(2, 3.5, 0),
  ]
  tight = bound.FleetCache(workers=1, blocks=1, max_delay_us=SECOND)
  blocks = bound.prefill(requests, 0, tight, cell_us=SECOND)
  # The 2 s hold of 4 blocks against 3.5 block-seconds: 1.75 blocks held.
  assert blocks.computed == pytest.approx(3 + 4 + 4 - 3.5 / 2)
  loose = dataclasses.replace(tight, max_delay_us=3 * SECOND)
  assert bound.prefill(requests, 0, loose).computed == 3 + 4
  # Uses at 9 and 9.5 s may share a batch, but whichever is served first
  # finds the prefix only if a cache held it from 1 s to 9 s.
  requests = [
      shared_request(0, 0.0, 0),
      shared_request(1, 9.0, 0),
      shared_request(2, 9.5, 0),
  ]
  assert bound.prefill(requests, 0,
                       tight).computed == pytest.approx(3 + 4 + 4 - 9.5 / 8)


def _computed_blocks(run, t0_cell=0):
  return sum(
      cell[0] for (_, _, arrived), cell in run.cells.items()
      if arrived >= t0_cell) / BLOCK_TOKENS


def test_batching_a_prefix_within_the_delay_beats_holding_it():
  # Two 4-block prefixes take turns every 0.1 s on one worker whose cache
  # holds one of them and a suffix. Batched by prefix, five at a time
  # within 1 s, each batch computes its prefix once; held between uses,
  # they would need twice the cache.
  requests = [shared_request(i, 0.1 * i, i % 2) for i in range(40)]
  batches = fleet.form_batches(
      requests, lambda r: (r.key, 0), batch_size=5, buffering_us=SECOND)
  run = deploy.evaluate(
      batches, deploy.HashPlacer(1, 's'), 1, 5, FREE, deploy.Charges(0))
  cache = bound.FleetCache(workers=1, blocks=5, max_delay_us=SECOND)
  assert _computed_blocks(run) == 40 + 8 * 4
  assert bound.prefill(requests, 0, cache).computed == 40 + 2 * 4
  # A bound that let no request wait would be above what this run
  # computes: it is not valid for strategies that buffer.
  unbuffered = dataclasses.replace(cache, max_delay_us=0)
  assert bound.prefill(requests, 0, unbuffered).computed > 40 + 8 * 4


def test_a_pair_served_together_still_needs_the_prefix_held_before_it():
  # Five 4-block prefixes each come as a pair of requests 0.5 s apart
  # every 100 s, staggered by 20 s, on one worker that caches one prefix
  # and a suffix. Batched by pair, each pair computes its prefix once; the
  # first of a pair reuses it only if a cache held it for 98.5 s.
  times = sorted((100.0 * k + 20.0 * p + half, p) for k in range(3)
                 for p in range(5) for half in (0.0, 0.5))
  requests = [shared_request(i, at_s, p) for i, (at_s, p) in enumerate(times)]
  cache = bound.FleetCache(workers=1, blocks=5, max_delay_us=SECOND)
  fewest = bound.prefill(requests, 0, cache).computed
  # 10 gaps of 98.5 s x 4 blocks against 5 blocks over 280.5 s.
  assert fewest == pytest.approx(30 + 20 + (10 - 5 * 280.5 / 394) * 4)
  batches = fleet.form_batches(
      requests, lambda r: (r.key, 0), batch_size=2, buffering_us=SECOND)
  run = deploy.evaluate(
      batches, deploy.HashPlacer(1, 's'), 1, 5, FREE, deploy.Charges(0))
  assert _computed_blocks(run) == 30 + 15 * 4
  assert bound.prefill(requests, 0).computed == 30 + 20 < fewest


def test_a_hold_is_charged_from_t0_on():
  # Scored from 10 s: the hold of the reuse at 12 s counts from 10 s.
  requests = [shared_request(0, 0.0, 0), shared_request(1, 12.0, 0)]
  cache = bound.FleetCache(workers=1, blocks=1, max_delay_us=0)
  blocks = bound.prefill(requests, 10, cache, cell_us=SECOND)
  # 2 s of budget, a 2 s hold of 4 blocks: a quarter held.
  assert (blocks.requests, blocks.total) == (1, 5)
  assert blocks.computed == pytest.approx(1 + 4 - 1)


def _random_requests(rng, count):
  out = []
  for rid in range(count):
    prefix = min(int(rng.expovariate(0.15)), 29)
    segments = (
        (segment(SYSTEM, prefix % 3), 1 + prefix % 3 % 2),
        (segment(SHARED, prefix), 1 + prefix % 4),
        (segment(SUFFIX, rid), 1),
    )
    out.append((rng.uniform(0, 10.0), prefix, segments))
  out.sort()
  return [
      request(rid, at_s, f'p{prefix}', segments=segments)
      for rid, (at_s, prefix, segments) in enumerate(out)
  ]


def _routes(rng, workers):
  keys = rng.randint(1, 6)
  return {
      'prefix': lambda r: (r.key, 0),
      'random': lambda r: (rng.randrange(keys), 0),
      'one key': lambda r: ('all', 0),
      'prefix and copy': lambda r: ((r.key, r.rid % workers), 0),
  }


def test_no_strategy_computes_fewer_blocks_than_the_bound():
  rng = random.Random(40905)
  limited = 0
  for case in range(60):
    requests = _random_requests(rng, rng.randint(40, 150))
    workers = rng.randint(1, 3)
    cache_blocks = rng.randint(6, 12)
    delay_us = rng.choice((0, SECOND // 2, 2 * SECOND))
    t0_cell = rng.randint(0, 5)
    cache = bound.FleetCache(workers, cache_blocks, delay_us)
    fewest = bound.prefill(requests, t0_cell, cache, cell_us=SECOND).computed
    limited += fewest > bound.prefill(
        requests, t0_cell, cell_us=SECOND).computed
    for name, route in _routes(rng, workers).items():
      batches = fleet.form_batches(
          requests, route, rng.choice((4, 16)), delay_us)
      placer = deploy.HashPlacer(workers, f'{case}/{name}')
      run = deploy.evaluate(
          batches,
          placer,
          workers,
          cache_blocks,
          FREE,
          deploy.Charges(0),
          cell_us=SECOND)
      bound.check_delays([run], delay_us)
      assert _computed_blocks(run, t0_cell) >= fewest - 1e-9, (case, name)
  # The cases exercise the caches' limit, not only the first uses.
  assert limited > 10, limited


def test_check_delays_names_the_limit():
  requests = [shared_request(i, 0.1 * i, 0) for i in range(3)]
  batches = fleet.form_batches(
      requests, lambda r: ('k', 0), batch_size=8, buffering_us=SECOND)
  run = deploy.evaluate(
      batches, deploy.HashPlacer(1, 's'), 1, 8, FREE, deploy.Charges(0))
  bound.check_delays([run], SECOND)
  with pytest.raises(ValueError, match='max_delay_us=500000'):
    bound.check_delays([run], SECOND // 2)


@pytest.mark.parametrize(
    'field, value, message',
    (
        ('workers', 0, 'workers must be positive, got 0'),
        ('blocks', -1, 'blocks must be positive, got -1'),
        ('max_delay_us', -1, 'max_delay_us must not be negative, got -1'),
    ))
def test_a_fleet_cache_rejects_bad_sizes(field, value, message):
  sizes = {'workers': 2, 'blocks': 8, 'max_delay_us': 0, field: value}
  with pytest.raises(ValueError, match=message):
    bound.FleetCache(**sizes)
