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

"""Tests of the benchmark's fleet and prefix-cache model."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import prefix_cache  # pylint: disable=wrong-import-position
from prefix_cache import Batch  # pylint: disable=wrong-import-position
from prefix_cache import PrefixCache  # pylint: disable=wrong-import-position
from prefix_cache import Workload  # pylint: disable=wrong-import-position

SMALL = Workload(
    'small',
    prefixes=4,
    zipf_s=1.1,
    prefix_tokens=64,
    suffix_tokens=16,
    requests=100,
    workers=2,
    cache_prefixes=1,
    batch_size=2)


def test_cache_reuses_the_longest_cached_run_of_leading_blocks():
  cache = PrefixCache(capacity_blocks=10)
  assert cache.serve(['a', 'b', 'c']) == 0
  assert cache.serve(['a', 'b', 'x']) == 2
  assert cache.serve(['b', 'a']) == 2
  assert cache.serve(['z', 'a']) == 0, 'reuse stops at the first miss'


def test_cache_evicts_the_least_recently_used_blocks():
  cache = PrefixCache(capacity_blocks=3)
  cache.serve(['a', 'b'])
  cache.serve(['c'])
  cache.serve(['a'])  # b is now the least recently used
  cache.serve(['d'])
  assert cache.serve(['a']) == 1
  assert cache.serve(['b']) == 0


def test_a_requests_tail_is_evicted_before_its_head():
  cache = PrefixCache(capacity_blocks=3)
  cache.serve(['p0', 'p1', 's0', 's1'])
  assert cache.serve(['p0', 'p1', 'other']) == 2


def test_workload_is_seeded_and_zipf_shaped():
  prefixes = prefix_cache.W1.prefix_of_requests()
  assert prefixes == prefix_cache.W1.prefix_of_requests()
  assert len(prefixes) == 40_000
  counts = [prefixes.count(p) for p in range(3)]
  assert counts[0] > counts[1] > counts[2]
  assert counts[0] / counts[1] == pytest.approx(2**1.1, rel=0.1)


def test_blocks_share_prefixes_and_not_suffixes():
  first, second = SMALL.blocks(0, 3), SMALL.blocks(1, 3)
  assert len(first) == (64 + 16) // 16
  assert first[:4] == second[:4] and first[4] != second[4]


def test_evaluate_pure_batches_on_one_worker():
  # Two requests of prefix 0, batched together: the second reuses the
  # prefix (4 blocks of 16 tokens) but not the first's suffix.
  batches = [Batch(0, [(0, 0), (1, 0)])]
  figures = prefix_cache.evaluate(SMALL, batches)
  assert figures['hit_rate'] == pytest.approx(64 / 160)
  assert figures['purity'] == 1.0
  assert figures['mean_batch_size'] == 2.0
  assert figures['load_max_over_mean'] == 2.0


def test_evaluate_replays_batches_in_the_order_they_are_sent():
  # The cache holds one prefix: 0, 1, 0 on one worker evicts prefix 0.
  batches = [Batch(0, [(2, 0)]), Batch(0, [(0, 0)]), Batch(0, [(1, 1)])]
  assert prefix_cache.evaluate(SMALL, batches)['hit_rate'] == 0.0
  mixed = [Batch(0, [(0, 0), (1, 1)]), Batch(1, [(2, 0)])]
  assert prefix_cache.evaluate(SMALL, mixed)['purity'] == 0.5


def test_bound_computes_each_prefix_once():
  assert prefix_cache.bound(
      SMALL,
      [0, 0, 1])['hit_rate'] == pytest.approx(1 - (2 * 64 + 3 * 16) / (3 * 80))


def test_worker_of_is_stable():
  assert prefix_cache.worker_of(('7', 0), 64) == prefix_cache.worker_of(
      ('7', 0), 64)
  workers = {prefix_cache.worker_of((str(k), 0), 8) for k in range(200)}
  assert workers == set(range(8))
