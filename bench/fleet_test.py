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

"""Tests of the benchmark's streaming fleet: batching, routing, the oracle
and the figures of a run."""

import random

import pytest

from bench import fleet
from bench.workloads import Request

SECOND = 1_000_000


def request(rid, at_s, key='a', reader=0, segments=None):
  return Request(
      rid,
      round(at_s * SECOND),
      key,
      reader,
      segments or ((ord(key[0]), 2), (1000 + rid, 1)))


def by_key(state_key_request):
  return (state_key_request.key, 0), 0


def shapes(batches):
  return [([r.rid for r in b.requests], b.emitted_us / SECOND) for b in batches]


def test_a_batch_is_emitted_when_full_at_the_arrival_that_fills_it():
  requests = [request(i, 0.1 * i) for i in range(5)]
  batches = fleet.form_batches(requests, by_key, 2, SECOND)
  assert shapes(batches) == [([0, 1], 0.1), ([2, 3], 0.3), ([4], 1.4)]


def test_the_buffering_timer_emits_an_incomplete_batch():
  requests = [request(0, 0.0), request(1, 0.5), request(2, 1.2)]
  batches = fleet.form_batches(requests, by_key, 8, SECOND)
  # The timer starts at the batch's first element, not its last.
  assert shapes(batches) == [([0, 1], 1.0), ([2], 2.2)]


def test_a_timer_due_at_an_arrival_fires_before_it():
  requests = [request(0, 0.0), request(1, 1.0)]
  batches = fleet.form_batches(requests, by_key, 8, SECOND)
  assert shapes(batches) == [([0], 1.0), ([1], 2.0)]


def test_a_full_batch_cancels_its_timer():
  requests = [request(0, 0.0), request(1, 0.9), request(2, 1.5)]
  batches = fleet.form_batches(requests, by_key, 2, SECOND)
  assert shapes(batches) == [([0, 1], 0.9), ([2], 2.5)]


def test_state_keys_batch_apart():
  requests = [request(i, 0.1 * i, key='ab'[i % 2]) for i in range(4)]
  batches = fleet.form_batches(requests, lambda r: ((r.key, 0), 0), 2, SECOND)
  assert shapes(batches) == [([0, 2], 0.2), ([1, 3], 0.3)]


def test_batch_size_must_be_positive():
  with pytest.raises(ValueError, match='batch_size'):
    fleet.form_batches([], by_key, 0, SECOND)


def test_baseline_batches_on_the_worker_that_read_the_request():
  assert fleet.baseline_route(request(0, 0, reader=3)) == (('shared', 3), 3)


def test_keyed_route_takes_every_num_shards_form():
  first = request(0, 0, key='a', reader=0)
  assert fleet.KeyedRoute(None, fleet.RandomPicker(1), 8)(first)[0] == ('a', 0)
  seen = {
      fleet.KeyedRoute(3, fleet.RandomPicker(1), 8)(first)[0][1]
      for _ in range(50)
  }
  assert seen == {0}, 'a new route per call: the same seeded first draw'
  route = fleet.KeyedRoute({'a': 4}, fleet.RandomPicker(1), 8)
  assert {route(first)[0][1] for _ in range(200)} == {0, 1, 2, 3}
  assert {route(request(1, 0, key='b'))[0][1] for _ in range(20)} == {0}
  state_key, worker = route(first)
  assert worker == fleet.worker_of(state_key, 8)


class CountingShards:
  """A stateful num_shards: 1 for a key's first element, then 2."""
  def __init__(self):
    self.seen = set()

  def __call__(self, key):
    count = 2 if key in self.seen else 1
    self.seen.add(key)
    return count


def test_a_num_shards_callable_is_copied_for_every_reader():
  spec = CountingShards()
  route = fleet.KeyedRoute(spec, fleet.StickyPicker(1, 1), 4)
  counts = [route._count(request(i, 0, reader=i % 2)) for i in range(4)]
  assert counts == [1, 1, 2, 2]
  assert not spec.seen, 'the original is left alone'


def test_random_picker_draws_as_with_batch_key_does():
  picker = fleet.RandomPicker('s')
  rng = random.Random('s')
  picks = [picker(0, 'k', count) for count in (1, 8, 1, 8, 8)]
  expected = [
      0, int(rng.random() * 8), 0, int(rng.random() * 8), int(rng.random() * 8)
  ]
  assert picks == expected


def test_sticky_picker_sends_runs_to_one_shard_per_reader_and_key():
  picker = fleet.StickyPicker(3, run=4)
  picks = [picker(0, 'k', 8) for _ in range(12)]
  assert all(len(set(picks[i:i + 4])) == 1 for i in (0, 4, 8))
  assert len(set(picks)) > 1
  assert picker(1, 'k', 1) == 0


def test_traffic_shards_follow_each_keys_share():
  requests = [request(i, 0, key='a' if i < 6 else f'k{i}') for i in range(10)]
  shards = fleet.traffic_shards(requests, 4)
  assert shards['a'] == 3 and shards['k7'] == 1


def test_oracle_spreads_hot_keys_and_balances_workers():
  keys = ['hot'] * 60 + ['warm'] * 20 + ['cold'] * 10 + ['c2'] * 10
  requests = [request(i, 0, key=k) for i, k in enumerate(keys)]
  route = fleet.OracleRoute(requests, 4, 2, lambda rid: 0)
  workers = {}
  for r in requests:
    state_key, worker = route(r)
    workers.setdefault(r.key, set()).add(worker)
  assert len(workers['hot']) == 3, 'ceil(60 / 25) replicas'
  loads = [0] * 4
  for r in requests:
    loads[route(r)[1]] += 1
  assert max(loads) <= 30


def test_oracle_batches_unique_keys_together():
  requests = [request(i, 0, key=f'u{i}') for i in range(4)]
  route = fleet.OracleRoute(requests, 2, 2, lambda rid: 0)
  assert {route(r)[0][0] for r in requests} == {'unique'}


def test_evaluate_counts_hits_work_delays_and_purity():
  shared = (7, 2)
  batches = [
      fleet.Batch(
          0,
          None,
          [
              request(0, 0.0, segments=(shared, (100, 1))),
              request(1, 0.5, segments=(shared, (101, 1)))
          ],
          emitted_us=SECOND),
      fleet.Batch(1, None, [request(2, 0.0, key='b')], emitted_us=SECOND),
  ]
  figures = fleet.evaluate(batches, 2, 10, 32, 8)
  # Worker 0 computes 3 + 1 blocks and reuses 2; worker 1 computes 3.
  assert figures['hit_rate'] == pytest.approx(2 / 9)
  assert figures['prompt_tokens_computed'] == 7 * 32
  assert figures['busiest_worker_work'] == 4 * 32 + 32 + 8
  assert figures['load_max_over_mean'] == pytest.approx(168 / 148)
  assert figures['p50_delay_s'] == 1.0 and figures['p99_delay_s'] == 1.0
  assert figures['mean_batch_size'] == 1.5
  assert figures['purity'] == 1.0


def test_evaluate_serves_a_workers_batches_in_emission_order():
  first = fleet.Batch(0, None, [request(0, 0, segments=((7, 2), ))], 2)
  second = fleet.Batch(0, None, [request(1, 0, segments=((7, 2), ))], 1)
  figures = fleet.evaluate([first, second], 1, 10, 0)
  assert figures['hit_rate'] == 0.5


def test_bound_computes_every_distinct_block_once():
  requests = [request(i, 0, segments=((7, 2), (100 + i, 1))) for i in range(3)]
  assert fleet.bound(requests)['hit_rate'] == pytest.approx(1 - 5 / 9)


def test_percentile_interpolates():
  assert fleet.percentile([1, 2, 3, 4], 50) == 2.5
  assert fleet.percentile([5], 99) == 5
  with pytest.raises(ValueError):
    fleet.percentile([], 50)


def test_worker_of_is_stable_and_spreads():
  assert fleet.worker_of(('7', 0), 64) == fleet.worker_of(('7', 0), 64)
  assert {fleet.worker_of((str(k), 0), 8) for k in range(200)} == set(range(8))
