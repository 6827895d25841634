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

"""Tests of benchmark v3's fleet: copies, placements and costs."""

import pytest

from bench import frames
from bench.fleet import Batch
from bench.fleet_test import SECOND
from bench.fleet_test import request


def test_a_request_is_read_by_a_copy_on_its_reader_worker():
  requests = [request(i, 0, reader=i % 3) for i in range(300)]
  copies = frames.copy_of(requests, frames.F2, 1)
  assert [c[0] for c in copies] == [r.reader for r in requests]
  assert {c[1] for c in copies} == set(range(frames.F2.processes))
  assert {c[2] for c in copies} == set(range(frames.F2.threads))
  assert copies == frames.copy_of(requests, frames.F2, 1)
  assert copies != frames.copy_of(requests, frames.F2, 2)
  assert frames.F2.copies_per_worker == 8 * frames.THREADS


def test_hash_placement_is_stable_and_salted():
  keys = [('k', i) for i in range(64)]
  first = frames.hash_placement(keys, 8, 'a')
  assert first == frames.hash_placement(keys, 8, 'a')
  assert first != frames.hash_placement(keys, 8, 'b')
  assert set(first.values()) == set(range(8))


def test_cut_ranges_minimizes_the_largest_contiguous_sum():
  assert frames.cut_ranges([1] * 8, 4) == [0, 0, 1, 1, 2, 2, 3, 3]
  runs = frames.cut_ranges([5, 1, 1, 1, 1, 1], 2)
  assert runs == [0, 1, 1, 1, 1, 1]
  runs = frames.cut_ranges([1, 2, 3, 4, 5], 2)
  sums = [
      sum(w for w, r in zip([1, 2, 3, 4, 5], runs) if r == i) for i in (0, 1)
  ]
  assert max(sums) == 9
  assert frames.cut_ranges([], 3) == []


def test_range_placement_gives_workers_contiguous_positions():
  work = {('k', i): 1.0 for i in range(40)}
  placement = frames.range_placement(work, 4, 's')
  ordered = sorted(work, key=lambda k: frames.position(k, 's'))
  workers = [placement[k] for k in ordered]
  assert workers == sorted(workers)
  assert [workers.count(w) for w in range(4)] == [10] * 4


def test_lpt_places_heaviest_first_and_keeps_groups_apart():
  work = {'a1': 5.0, 'a2': 5.0, 'b': 3.0, 'c': 2.0}
  placement = frames.lpt_placement(
      work, 2, apart=lambda k: 'a' if k.startswith('a') else None)
  assert placement['a1'] != placement['a2']
  loads = [0.0, 0.0]
  for k, w in placement.items():
    loads[w] += work[k]
  assert sorted(loads) == [7.0, 8.0]
  assert placement['c'] != placement['b']


def test_evaluate_counts_decode_and_attributes_work_to_state_keys():
  shared = (7, 2)
  batches = [
      Batch(0, 'x', [request(0, 0, segments=(shared, (100, 1)))], SECOND),
      Batch(0, 'y', [request(1, 0, segments=(shared, (101, 1)))], 2 * SECOND),
  ]
  costs = frames.Costs(10, 0, decode_tokens=4, decode_token_cost=2.0)
  same = frames.evaluate(batches, {'x': 0, 'y': 0}, 2, 10, costs)
  apart = frames.evaluate(batches, {'x': 0, 'y': 1}, 2, 10, costs)
  # Together the second request reuses the shared prefix (2 blocks).
  assert same['hit_rate'] == pytest.approx(2 / 6)
  assert apart['hit_rate'] == 0
  assert same['work_by_key']['x'] == 3 * 32 + 10 + 8
  assert same['work_by_key']['y'] == 1 * 32 + 10 + 8
  assert same['busiest_worker_work'] == sum(same['work_by_key'].values())
  assert apart['load_max_over_mean'] == pytest.approx(1.0)
  assert same['placement'] == {'x': 0, 'y': 0}


def test_ranges_balance_keys_of_equal_work_exactly():
  batches = [
      Batch(
          0, ('uuid', i), [request(i, 0, segments=((2000 + i, 2), ))], SECOND)
      for i in range(16)
  ]
  costs = frames.Costs(0, 0)
  figures = frames.place_and_evaluate(batches, frames.F3, 's', 4, 100, costs)
  assert figures['load_max_over_mean'] == pytest.approx(1.0)
  hashed = frames.place_and_evaluate(batches, frames.F2, 's', 4, 100, costs)
  assert hashed['load_max_over_mean'] > 1.0


def test_f1_places_the_shared_keys_on_their_readers():
  batches = [
      Batch(0, ('shared', i % 2), [request(i, 0, reader=i % 2)], SECOND)
      for i in range(4)
  ]
  figures = frames.place_and_evaluate(
      batches, frames.F1, 's', 2, 100, frames.Costs(0, 0), on_reader=True)
  assert figures['placement'] == {('shared', 0): 0, ('shared', 1): 1}


def test_bundles_batch_per_copy_within_a_bundle():
  requests = [
      request(0, 0.00),
      request(1, 0.05),
      request(2, 0.06, reader=1),
      request(3, 0.20)
  ]
  copies = [(r.reader, 0, 0) for r in requests]
  batches = frames.bundle_batches(requests, copies, 8, SECOND // 10)
  shapes = sorted(([r.rid for r in b.requests], b.worker) for b in batches)
  assert shapes == [([0, 1], 0), ([2], 1), ([3], 0)]
  full = frames.bundle_batches(requests[:2], copies, 2, SECOND)
  assert [len(b.requests) for b in full] == [2]
  assert full[0].emitted_us == requests[1].arrival_us


def test_median_index_picks_the_lower_middle_run():
  assert frames.median_index([3.0, 1.0, 2.0]) == 2
  assert frames.median_index([4.0, 1.0, 3.0, 2.0]) == 3
