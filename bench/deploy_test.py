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

"""Tests of benchmark v4's placements and scoring, and of its cost
model and batch deployment."""

import dataclasses

import pytest

from bench import batch as batch_model
from bench import costs
from bench import deploy
from bench import policies
from bench.fleet import Batch
from bench.fleet_test import SECOND
from bench.fleet_test import request
from bench.workloads import BLOCK_TOKENS
from bench.workloads import SHARED
from bench.workloads import SUFFIX
from bench.workloads import segment

FREE = costs.EngineModel(
    batch_tokens=0.0,
    request_tokens=0.0,
    decode_token_tokens=1.0,
    prefill_half=0.0,
    decode_half=0.0,
    shuffle_tokens=0.0)


def shared_request(rid, at_s, prefix, key=None):
  return request(
      rid,
      at_s,
      key or f'p{prefix}',
      segments=((segment(SHARED, prefix), 4), (segment(SUFFIX, rid), 1)))


def test_efficiency_is_one_at_max_num_seqs_and_falls_below():
  model = costs.GPU
  assert model.efficiency(model.max_num_seqs, 48) == pytest.approx(1.0)
  assert model.efficiency(8, 48) < model.efficiency(64, 48) < 1
  assert model.in_flight(96, 1.0) == 96
  assert model.in_flight(96, 8.0) == model.max_num_seqs


def test_fit_half_recovers_the_form():
  points = [(n, 100 * n / (n + 3.0)) for n in (1, 2, 4, 8)]
  half, peak = costs.fit_half(points)
  assert half == pytest.approx(3.0, rel=0.05)
  assert peak == pytest.approx(100, rel=0.05)
  with pytest.raises(ValueError, match='two points'):
    costs.fit_half([(1, 1.0)])


def test_range_placer_recuts_on_past_work_only():
  placer = deploy.RangePlacer(2, 'salt', window_us=10 * SECOND, decay=1.0)
  keys = [('k', i) for i in range(20)]
  before = {k: placer(k, 0) for k in keys}
  # Work observed now moves the cuts only at the next window.
  hot = keys[0]
  placer.observe(hot, 1000.0, 1)
  for k in keys[1:]:
    placer.observe(k, 1.0, 1)
  assert {k: placer(k, 5 * SECOND) for k in keys} == before
  after = {k: placer(k, 10 * SECOND) for k in keys}
  assert placer.recuts == 1
  work = {k: 1000.0 if k == hot else 1.0 for k in keys}

  def busiest(placement):
    loads = [0.0, 0.0]
    for k, w in placement.items():
      loads[w] += work[k]
    return max(loads)

  # The cut gives the hot key's worker as few others as ranges allow.
  others = [k for k in keys if after[k] == after[hot] and k != hot]
  assert busiest(after) <= busiest(before)
  assert busiest(after) == 1000.0 + len(others)
  assert len(others) < len(keys) / 2


def test_capacity_sums_the_busiest_worker_of_every_window():
  # Worker 0 computes 2 requests in window 0, worker 1 one request in
  # window 1: capacity = 3 requests / (2 + 1 request's work).
  requests = [shared_request(i, 0.1 * i, i) for i in range(2)]
  late = shared_request(2, 10.5, 2)
  batches = [
      Batch(0, 'a', requests, round(0.5 * SECOND)),
      Batch(0, 'b', [late], round(10.6 * SECOND)),
  ]
  placement = {'a': 0, 'b': 1}
  run = deploy.evaluate(
      batches,
      deploy.StaticPlacer(placement, 2),
      2,
      1000,
      FREE,
      deploy.Charges(0),
      cell_us=10 * SECOND)
  figures = deploy.score(run, 0, 0, FREE, 8, 3)
  per_request = 5 * BLOCK_TOKENS
  assert figures['capacity']['2s'] == pytest.approx(3 / (3 * per_request))
  # Spread evenly, each of the 2 workers would do 1.5 requests' work.
  assert figures['capacity'][deploy.BALANCED] == pytest.approx(
      3 / (1.5 * per_request))
  assert figures['hit_rate'] == 0.0
  assert figures['mean_batch_size'] == 1.5
  # Scored from the second cell on: only the late request counts.
  assert deploy.score(run, 1, 0, FREE, 8, 1)['capacity']['whole'] == (
      pytest.approx(1 / per_request))


def test_the_serial_figure_caps_requests_in_flight_by_the_busiest_keys_share():
  # Four batches of 2 in one cell. Each state key runs one batch at a time,
  # so a saturated worker has at most 2 requests in flight per busiest
  # key's share of its requests; the other figures let 8 DoFn threads have
  # all 8.
  model = dataclasses.replace(FREE, decode_half=4.0)
  requests = [shared_request(i, 0.1 * i, i) for i in range(8)]

  def capacity(keys, window=deploy.SERIAL, serial_batch=2):
    batches = [
        Batch(0, keys[i], requests[2 * i:2 * i + 2], round(0.9 * SECOND))
        for i in range(4)
    ]
    run = deploy.evaluate(
        batches,
        deploy.StaticPlacer(dict.fromkeys(keys, 0), 1),
        1,
        1000,
        model,
        deploy.Charges(0))
    return deploy.score(
        run, 0, 1, model, 8, 8, serial_batch=serial_batch)['capacity'][window]

  # Decode work: 8 requests x 1 token at n in flight, against the engine's
  # rate at max_num_seqs.
  top = model.max_num_seqs / (model.max_num_seqs + 4)

  def work(n):
    return 8 * 5 * BLOCK_TOKENS + 8 / ((n / (n + 4)) / top)

  assert capacity(['a', 'a', 'b', 'b'], '10s') == pytest.approx(8 / work(16))
  # Two keys of half the requests each: 2 / 0.5 in flight.
  assert capacity(['a', 'a', 'b', 'b']) == pytest.approx(8 / work(4))
  # Four keys of a quarter each: 2 / 0.25.
  assert capacity(['a', 'b', 'c', 'd']) == pytest.approx(8 / work(8))
  # Three quarters on one key: it sets the limit, 2 / 0.75.
  assert capacity(['a', 'a', 'a', 'b']) == pytest.approx(8 / work(8 / 3))
  with pytest.raises(KeyError):
    capacity(['a', 'b', 'c', 'd'], serial_batch=None)


def test_a_spread_first_stage_moves_a_keys_measuring_off_one_worker():
  # One hot key: its batches on worker 0, its measuring step's shuffles on
  # the worker its first-stage key hashes to.
  requests = [shared_request(i, 0.01 * i, 0) for i in range(64)]
  batches = [
      Batch(0, 'shard', requests[i:i + 8], requests[i].arrival_us)
      for i in range(0, 64, 8)
  ]

  def shuffles_per_worker(spread):
    run = deploy.evaluate(
        batches,
        deploy.StaticPlacer({'shard': 0}, 8, 'salt'),
        8,
        1000,
        FREE,
        deploy.Charges(1, True, spread))
    per_worker = [0] * 8
    for (worker, _, _), cell in run.cells.items():
      per_worker[worker] += cell[3]
    return per_worker

  own = shuffles_per_worker(1)
  # The batches' own shuffles on worker 0, the measuring step's 64 on one.
  assert sum(own) == 128 and own[0] >= 64
  assert sorted(own)[-2:] in ([64, 64], [0, 128])
  spread = shuffles_per_worker(8)
  assert sum(spread) == 128
  # Spread over 8 measuring keys, the first stage lands on more workers.
  others = [n for w, n in enumerate(spread) if w != 0]
  assert sum(1 for n in others if n) > 1
  assert max(others) < 64
  with pytest.raises(ValueError, match='first_stage_spread.*0'):
    deploy.Charges(1, True, 0)


def test_the_measuring_shards_of_a_batch_move_the_first_stage():
  # 1,000 requests of one key over 4 readers: each keeps its first two
  # batches on measuring shard 0 and sends each further run of 4 batches to
  # its next other measuring shard; the first stage's shuffles follow
  # them.
  requests = [shared_request(i, 0.0, 0, key='hot') for i in range(1000)]
  measuring = batch_model.measuring_shards(requests, 4, 8, 4, 'salt')
  assert sum(1 for m in measuring.values() if m) == 1000 - 4 * 16
  assert 0 not in measuring.values()
  for reader in range(4):
    split = [
        measuring.get(i, 0) for i in range(250 * reader, 250 * reader + 250)
    ]
    assert split[:16] == [0] * 16
    runs = [split[i:i + 32] for i in range(16, 250, 32)]
    assert [len(set(run)) for run in runs] == [1] * len(runs)
    firsts = [run[0] for run in runs]
    assert [(b - a) % 15 for a, b in zip(firsts, firsts[1:])] == [1] * 7
  batches = [Batch(0, 'shard', requests[i:i + 8], 0) for i in range(0, 1000, 8)]

  def busiest_first_stage(first_stage_of):
    run = deploy.evaluate(
        batches,
        deploy.StaticPlacer({'shard': 0}, 16, 'salt'),
        16,
        1000,
        FREE,
        deploy.Charges(1, True, first_stage_of=first_stage_of))
    per_worker = [0] * 16
    for (worker, _, _), cell in run.cells.items():
      per_worker[worker] += cell[3]
    per_worker[0] -= 1000
    return sum(per_worker), max(per_worker)

  assert busiest_first_stage(None) == (1000, 1000)
  total, busiest = busiest_first_stage(measuring)
  assert total == 1000 and busiest < 300


def test_a_measuring_shard_keeps_its_runs_and_its_held_elements():
  spec = policies.TwoStageSpec(
      rate_per_shard=1.0, split_from=2.0, max_shards=64, run_batches=4)
  requests = [shared_request(i, 0.0, 0, key='hot') for i in range(100)]
  # Measuring shard 0 gets 40, shard 3 the next 50, shards 5 and 6 five each.
  measuring = {i: 3 for i in range(40, 90)}
  measuring.update({i: 5 for i in range(90, 95)})
  measuring.update({i: 6 for i in range(95, 100)})
  keys = batch_model.two_stage_keys(spec, requests, 8, measuring=measuring)
  # Shard 0's runs are shards 0 and 1; shard 3's start at 3 x 64 / 16.
  assert keys[:32] == [('hot', 0)] * 32
  assert keys[32:40] == [('hot', 1)] * 8
  assert keys[40:72] == [('hot', 12)] * 32
  assert keys[72:90] == [('hot', 13)] * 18
  # 5 elements, cold and never warm: held, then to the first shard of
  # their measuring shard, not to the cold keys' batches.
  assert keys[90:95] == [('hot', 20)] * 5
  assert keys[95:] == [('hot', 24)] * 5


def test_warm_time_needs_every_worker():
  requests = [shared_request(i, 0.1 * i, i) for i in range(40)]
  batches = [Batch(0, i % 2, [r], r.arrival_us) for i, r in enumerate(requests)]
  placement = {0: 0, 1: 1}
  run = deploy.evaluate(
      batches,
      deploy.StaticPlacer(placement, 2),
      2,
      20,
      FREE,
      deploy.Charges(0),
      track_prefixes=True)
  evicted = deploy.warm_time(run, holds=False)
  assert evicted == max(run.evicted_at)
  assert deploy.warm_time(run, holds=True) > 0
  cold = deploy.evaluate(
      batches[:2],
      deploy.StaticPlacer(placement, 2),
      2,
      1000,
      FREE,
      deploy.Charges(0))
  assert deploy.warm_time(cold, holds=False) is None


def test_stateless_batches_split_the_input_in_order():
  requests = [shared_request(i, 0.1 * i, 0) for i in range(20)]
  batches, placement = batch_model.stateless_batches(requests, 2, 4, 'salt')
  assert [len(b.requests) for b in batches] == [4, 4, 2, 4, 4, 2]
  assert {placement[b.state_key] for b in batches[:3]} == {0}
  rids = [r.rid for b in batches for r in b.requests]
  assert sorted(rids) == list(range(20))


def test_two_stage_keys_in_a_batch_runner_move_every_run():
  spec = policies.TwoStageSpec(
      rate_per_shard=1.0, split_from=2.0, max_shards=64, run_batches=4)
  requests = [shared_request(i, 0.01 * i, 0, key='hot') for i in range(100)]
  requests += [shared_request(100, 0.0, 1, key='once')]
  keys = batch_model.two_stage_keys(spec, requests, 8)
  assert keys[:32] == [('hot', 0)] * 32
  assert keys[32:64] == [('hot', 1)] * 32
  assert keys[96:100] == [('hot', 3)] * 4
  assert keys[100] == ('once', 0)
  grouped = batch_model.group(requests, keys, 8)
  assert [len(b) for b in grouped[('hot', 3)]] == [4]
  assert [len(b) for b in grouped[('hot', 0)]] == [8, 8, 8, 8]
