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

"""Tests of the model of issue 24's default: cold keys share their
measuring process's state key, warm keys keep 0013's shards and runs, with
hysteresis; adaptive_v3 is the same policy with every key warm."""

import random

import pytest

from bench import batch as batch_model
from bench import deploy
from bench import fleet
from bench import policies
from bench.fleet_test import request
from bench.v4_test import SPEC
from bench.workloads import MICROS

BATCH = 8
WORKERS = 4
PROCESSES = 8


def _route(spec, seed=1):
  return policies.route_for(
      spec, [],
      seed,
      batch_size=BATCH,
      buffering_s=1.0,
      cold_key=policies.cold_key_of(seed, WORKERS, PROCESSES))


def _stream(keys_at):
  """Requests from (time s, key) pairs, in time order, read by a random
  worker."""
  rng = random.Random(3)
  return [
      request(i, at, key=key, reader=rng.randrange(WORKERS))
      for i, (at, key) in enumerate(sorted(keys_at))
  ]


def _batches(requests, route):
  return fleet.form_batches(requests, route, BATCH, MICROS)


def _mean(batches):
  return sum(len(b.requests) for b in batches) / len(batches)


def _unique(count, rate):
  return _stream([(i / rate, f'u{i}') for i in range(count)])


def test_unique_prompts_fill_batches_as_the_baseline_does():
  # 64 unique prompts a second over 4 workers of 8 processes: 2 per
  # process and second, as 2.77.0's per-process keys batch them.
  requests = _unique(3000, 64.0)
  rng = random.Random(5)
  copies = [(r.reader, rng.randrange(PROCESSES), 0) for r in requests]
  baseline = _mean(_batches(requests, policies.PerProcessKey(copies)))
  default = _mean(_batches(requests, _route(SPEC)))
  v3 = _mean(_batches(requests, _route(policies.adaptive_v3(SPEC))))
  assert baseline > 1.5
  assert default >= 0.9 * baseline
  assert v3 == 1.0


def test_a_hot_key_keeps_pure_batches():
  # A key at 40 a second among 3000 unique prompts at 30 a second.
  hot = [(i / 40, 'hot') for i in range(4000)]
  requests = _stream(hot + [(i / 30, f'u{i}') for i in range(3000)])
  batches = _batches(requests, _route(SPEC))
  cold_hot = 0
  for batch in batches:
    keys = {r.key for r in batch.requests}
    if batch.state_key[0] == 'cold':
      cold_hot += sum(1 for r in batch.requests if r.key == 'hot')
    else:
      assert keys == {'hot'}, batch.state_key
  # Only the hot key's first elements, before it is measured warm, are cold.
  assert 0 < cold_hot < 8
  hot_batches = [b for b in batches if b.state_key[0] == 'hot']
  assert _mean(hot_batches) > 7
  assert len({b.state_key for b in hot_batches}) > 8


def test_a_recurring_cold_key_always_maps_to_the_same_worker():
  # A key every 2 s among unique prompts, over 10 minutes.
  recurring = [(2.0 * i + 0.5, 'again') for i in range(300)]
  requests = _stream(recurring + [(i / 30, f'u{i}') for i in range(18000)])
  route = _route(SPEC)
  state_keys = {route(r)[0] for r in requests if r.key == 'again'}
  assert len(state_keys) == 1
  (state_key, ) = state_keys
  assert state_key[0] == 'cold'
  for salt in ('a', 'b', 'c'):
    placer = deploy.HashPlacer(WORKERS, salt)
    workers = {
        placer(b.state_key, b.emitted_us)
        for b in _batches(requests, _route(SPEC)) if any(
            r.key == 'again' for r in b.requests)
    }
    assert len(workers) == 1, salt


def test_the_cold_keys_are_one_per_measuring_process():
  cold_key = policies.cold_key_of(7, WORKERS, PROCESSES)
  keys = {cold_key(f'u{i}') for i in range(5000)}
  assert keys == {('cold', m) for m in range(WORKERS * PROCESSES)}
  assert cold_key('u1') == cold_key('u1')
  # Seeds draw their own processes.
  other = policies.cold_key_of(8, WORKERS, PROCESSES)
  assert any(other(f'u{i}') != cold_key(f'u{i}') for i in range(100))


def _states(rate_then):
  """Whether the key is cold at each element, for (rate, seconds) phases."""
  route = _route(SPEC)
  at, cold = 0.0, []
  for rate, seconds in rate_then:
    for _ in range(int(rate * seconds)):
      at += 1 / rate
      cold.append(route(request(0, at, key='k'))[0][0] == 'cold')
  return cold


def test_warm_at_own_batches_from_and_cold_below_half_of_it():
  # 5 a second: between F / 2 = 4 and F = 8 per buffering period.
  assert all(_states([(5, 120)]))
  warm_then_five = _states([(12, 60), (5, 120)])
  assert warm_then_five[:5] == [True] * 5
  assert not any(warm_then_five[12 * 60:])
  warm_then_two = _states([(12, 60), (2, 240)])
  assert not any(warm_then_two[12 * 60:12 * 60 + 10])
  assert all(warm_then_two[-100:])


def test_a_small_batch_size_lowers_the_warm_rate():
  route = policies.two_stage_from(SPEC, 4, 1.0)
  cold = [route(request(i, i / 5, key='k'))[0][0] == 'cold' for i in range(60)]
  assert not any(cold[20:])


def test_a_long_buffering_period_is_judged_over_the_decay_period():
  # As 0013's _next_shard: the rate reflects about decay_secs (30 s), so
  # with 60 s buffering a key seen every 120 s stays cold (judged over 60 s
  # it would be warm from its first element at the default
  # own_batches_from, 2), and one seen every second turns warm.
  spec = policies.TwoStageSpec(
      rate_per_shard=1.0, split_from=2.0, run_batches=1, own_batches_from=2)
  route = policies.two_stage_from(spec, BATCH, 60.0)
  rare = [route(request(i, 120 * i, key='rare'))[0][0] for i in range(5)]
  assert rare == ['cold'] * 5
  busy = [route(request(i, 1000 + i, key='busy'))[0][0] for i in range(10)]
  assert busy[-1] != 'cold'


def test_adaptive_v3_never_has_cold_keys():
  v3 = policies.adaptive_v3(SPEC)
  assert v3.own_batches_from is None
  assert (v3.rate_per_shard, v3.split_from, v3.run_batches) == (1.0, 2.0, 4)
  route = _route(v3)
  assert all(route(r)[0][0] != 'cold' for r in _unique(100, 10.0))


def test_own_batches_from_must_be_positive():
  with pytest.raises(ValueError, match='own_batches_from must be positive'):
    policies.TwoStage(1.0, own_batches_from=0)


def test_in_a_batch_runner_cold_elements_wait_for_their_key():
  requests = [request(i, 0, key='k' if i < 20 else 'j') for i in range(23)]
  requests += [request(23 + i, 0, key=f'u{i}') for i in range(6)]
  keys = batch_model.two_stage_keys(
      SPEC, requests, BATCH, cold_key=lambda key: ('cold', 'p'))
  # A count of 8 at one instant is 8 elements per buffering period: k's
  # first 7 elements are held, and join its first shard when the 8th makes
  # it warm, before its run of 8. j and the unique keys never turn warm:
  # they share the cold slot.
  cold = ('cold', 'p', 0)
  assert len(set(keys[:15])) == 1 and keys[0][0] == 'k'
  assert keys[15] != keys[0] and keys[15][0] == 'k'
  assert keys[20:] == [cold] * 9
  grouped = batch_model.group(requests, keys, BATCH)
  assert [len(b) for b in grouped[cold]] == [8, 1]
  assert {r.key for r in grouped[cold][0]} >= {'j', 'u0'}


def test_unique_prompts_in_a_batch_runner_fill_batches():
  requests = [request(i, 0, key=f'u{i}') for i in range(4000)]
  cold_key = policies.cold_key_of(1, WORKERS, PROCESSES)
  keys = batch_model.two_stage_keys(SPEC, requests, BATCH, cold_key=cold_key)
  grouped = batch_model.group(requests, keys, BATCH)
  sizes = [len(b) for batches in grouped.values() for b in batches]
  assert sum(sizes) / len(sizes) > 0.9 * BATCH
  # About 125 cold elements in each measuring process, released at the
  # input's end, fill its cold slots one after another, 8 full batches
  # each but the last.
  processes = {('cold', m) for m in range(WORKERS * PROCESSES)}
  assert {k[:2] for k in grouped} == processes
  for process in processes:
    slots = sorted(k[2] for k in grouped if k[:2] == process)
    assert slots == list(range(len(slots)))
    for slot in slots[:-1]:
      assert [len(b) for b in grouped[process + (slot, )]] == [BATCH] * 8
  v3 = batch_model.two_stage_keys(
      policies.adaptive_v3(SPEC), requests, BATCH, cold_key=cold_key)
  assert len(set(v3)) == len(requests)
