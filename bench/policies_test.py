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

"""Tests of the routes: the baseline's keys, copied num_shards learners and
the two-stage policy."""

import dataclasses

import pytest

from bench import policies
from bench.fleet_test import CountingShards
from bench.fleet_test import request


def test_the_baseline_batches_per_reading_process():
  copies = [(3, 5, 1), (3, 5, 7), (3, 6, 0)]
  route = policies.PerProcessKey(copies)
  keys = [route(request(i, 0, reader=3))[0] for i in range(3)]
  assert keys == [('uuid', 3, 5), ('uuid', 3, 5), ('uuid', 3, 6)]


@pytest.mark.parametrize(
    'scope, expected',
    [
        ('copy', [1, 1, 2, 1]),
        ('process', [1, 1, 2, 2]),
        ('fleet', [1, 2, 2, 2]),
        ('element', [1, 1, 1, 1]),
    ])
def test_a_learning_num_shards_is_copied_per_scope(scope, expected):
  # Requests 0 and 2 share a copy; 1 and 3 share a process with 2.
  copies = [(0, 0, 0), (1, 0, 0), (0, 0, 0), (0, 0, 1)]
  spec = CountingShards()
  route = policies.CopiedShards(spec, copies, 1, scope)
  assert [
      route.count(request(i, 0, reader=copies[i][0])) for i in range(4)
  ] == expected
  assert not spec.seen


def test_fixed_and_mapped_shard_counts():
  copies = [(0, 0, 0)] * 50
  assert policies.CopiedShards(None, copies, 1).count(request(0, 0)) == 1
  route = policies.CopiedShards({'a': 3}, copies, 1)
  assert {route(request(i, 0))[0][1] for i in range(50)} == {0, 1, 2}
  assert route.count(request(0, 0, key='b')) == 1
  with pytest.raises(ValueError, match='scope'):
    policies.CopiedShards(8, copies, 1, 'worker')


def steady(rate, seconds, key='a', start=0.0):
  step = 1 / rate
  return [
      request(i, start + i * step, key=key) for i in range(int(rate * seconds))
  ]


def test_two_stage_gives_a_key_a_shard_per_rate_per_shard():
  policy = policies.TwoStage(2.0, tau_s=30, min_span_s=1, max_shards=64)
  counts = [policy.shards_of('a', r.arrival_us)[1] for r in steady(7, 60)]
  # 7 elements per second: 4 shards of at most 2 per second.
  assert counts[-1] == 4
  assert counts[0] == 1
  quiet = policies.TwoStage(2.0, tau_s=30)
  assert quiet.shards_of('a', 0)[1] == 1


def test_two_stage_splits_only_keys_that_fill_a_batch_in_time():
  policy = policies.TwoStage(2.0, split_from=8.0)
  assert [policy.shards_of('a', r.arrival_us)[1]
          for r in steady(6, 60)][-1] == 1
  policy = policies.TwoStage(2.0, split_from=8.0)
  assert [policy.shards_of('a', r.arrival_us)[1]
          for r in steady(11, 60)][-1] == 6


def test_two_stage_caps_shards_and_follows_a_falling_rate():
  policy = policies.TwoStage(1.0, tau_s=5, max_shards=6)
  for r in steady(20, 20):
    count = policy.shards_of('a', r.arrival_us)[1]
  assert count == 6
  for r in steady(1.5, 60, start=20.0):
    count = policy.shards_of('a', r.arrival_us)[1]
  assert count == 2


def test_two_stage_sends_runs_of_a_batch_to_one_shard_in_turn():
  policy = policies.TwoStage(2.0, run_length=4, run_timeout_s=1.0)
  shards = [policy(r)[0][1] for r in steady(16, 20)]
  tail = shards[-32:]
  runs = [tail[i:i + 4] for i in range(0, 32, 4)]
  assert all(len(set(run)) == 1 for run in runs)
  firsts = [run[0] for run in runs]
  assert all((b - a) % 8 == 1 for a, b in zip(firsts, firsts[1:]))


def test_a_run_older_than_the_buffering_moves_on():
  policy = policies.TwoStage(0.5, run_length=8, run_timeout_s=1.0)
  shards = [policy(r)[0][1] for r in steady(2, 10)]
  # Two elements per second: a run ends with its buffering timer, after
  # two elements, and the next goes to the next shard.
  assert shards[:2] == [0, 0]
  assert shards[2] != shards[0]


def test_a_two_stage_spec_is_recognized_by_its_attributes():
  spec = policies.TwoStageSpec()
  assert policies.is_two_stage(spec)
  assert not policies.learns_per_copy(spec)
  assert policies.learns_per_copy(CountingShards())
  assert not policies.learns_per_copy(8)
  route = policies.route_for(spec, [], 1, batch_size=8, buffering_s=1.0)
  assert isinstance(route, policies.TwoStage)
  assert route.rate_per_shard == 2.0 and route.split_from == 8.0
  assert route.run_length == 4 * 8 and route.run_timeout_us == 4e6
  one = policies.route_for(
      policies.TwoStageSpec(rate_per_shard=3.0, split_from=0.0, run_batches=1),
      [],
      1,
      batch_size=8,
      buffering_s=2.0)
  assert (one.rate_per_shard, one.split_from, one.run_length) == (3.0, 0.0, 8)
  assert one.run_timeout_us == 2e6
  assert isinstance(
      policies.route_for(8, [], 1, batch_size=8, buffering_s=1.0),
      policies.CopiedShards)


def test_bounded_input_takes_the_specs_bounded_runs_and_shards():
  # As 0013's BatchElements.expand on a batch pipeline's bounded input.
  @dataclasses.dataclass(frozen=True)
  class Spec:
    rate_per_shard: float = 1.0
    max_shards: int = 64
    decay_secs: float = 30.0
    run_batches: int = 1
    own_batches_from: int = 2
    bounded_run_batches: int = 16
    bounded_max_shards: int = 256
    bounded_own_batches_from: int = 8

  bounded = policies.on_bounded_input(Spec())
  assert (bounded.run_batches, bounded.max_shards,
          bounded.own_batches_from) == (16, 256, 8)
  # A spec without them (one before the tree had them) is kept as it is.
  spec = policies.TwoStageSpec()
  assert policies.on_bounded_input(spec) is spec


def test_known_shares_size_shards_by_the_runs_traffic():
  requests = [request(i, 0, key='a' if i < 60 else f'k{i}') for i in range(100)]
  route = policies.KnownShares(requests, 4, 2, 1, pick='runs', run_length=2)
  shards = [route(r)[0][1] for r in requests[:10]]
  assert shards == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
  assert route(requests[70])[0] == ('k70', 0)


def test_oracle_replicas_are_grouped_by_key_and_span():
  assert policies.oracle_group(('a', 0, 2)) == ('a', 0)
  assert policies.oracle_group(('unique', 3)) is None


def test_cold_keys_pool_by_measuring_process_or_for_the_fleet():
  by_process = policies.cold_key_of(7, 4, 8)
  keys = {by_process(f'k{i}') for i in range(2000)}
  # One cold key per measuring process, the same for a key every time.
  assert len(keys) == 32 and by_process('k1') == by_process('k1')
  by_fleet = policies.cold_key_of(7, 4, 8, 'fleet')
  assert {by_fleet(f'k{i}')
          for i in range(2000)} == {('cold', )}
  with pytest.raises(ValueError, match="cold_scope.*'worker'"):
    policies.cold_key_of(7, 4, 8, 'worker')
