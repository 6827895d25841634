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

"""Tests of the benchmark's workloads and of phase A's bookkeeping."""

import statistics
from collections import Counter

import pytest

from bench import workloads

SMALL = workloads.FlatWorkload(
    'small',
    requests=400,
    workers=2,
    cache_prefixes=2,
    batch_size=4,
    zipf_s=1.1,
    prefixes=6,
    prefix_tokens=128,
    suffix_tokens=32)
CHAT = workloads.W3.scaled(requests=4000, workers=4)


def test_requests_are_seeded():
  assert SMALL.requests_at(4, 1) == SMALL.requests_at(4, 1)
  assert SMALL.requests_at(4, 1) != SMALL.requests_at(4, 2)


def test_w1_keeps_its_zipf_popularity():
  keys = Counter(r.key for r in workloads.W1.requests_at(16, 1))
  assert keys['p0'] / keys['p1'] == pytest.approx(2**1.1, rel=0.1)
  assert workloads.W1.cache_blocks == 8 * 1024 // workloads.BLOCK_TOKENS


def test_arrivals_come_at_the_rate():
  times = workloads.arrivals(20_000, 50.0, seed=3)
  assert all(a < b for a, b in zip(times, times[1:]))
  assert times[-1] / workloads.MICROS == pytest.approx(400, rel=0.05)


def test_flat_prompts_share_the_prefix_and_not_the_suffix():
  first, second = [r for r in SMALL.requests_at(4, 1) if r.key == 'p0'][:2]
  assert first.segments[0] == second.segments[0] == (
      workloads.segment(workloads.SHARED, 0), 4)
  assert first.segments[1] != second.segments[1]
  assert first.tokens == 160


def test_chat_workload_nests_prefixes_and_varies_lengths():
  requests = CHAT.requests_at(4, 1)
  chats = [r for r in requests if r.key.startswith('s')]
  system = {r.segments[0] for r in chats if r.key.startswith('s0f')}
  assert len(system) == 1, 'one system prompt under all its few-shots'
  assert len({r.key for r in chats if r.key.startswith('s0f')}) > 1
  suffixes = [r.segments[-1][1] * workloads.BLOCK_TOKENS for r in requests]
  assert max(suffixes) <= 1024 and min(suffixes) >= 32
  assert statistics.median(suffixes) < max(suffixes)
  unique = sum(1 for r in requests if r.key.startswith('u'))
  assert unique / len(requests) == pytest.approx(0.1, abs=0.02)


def test_chat_popularity_drifts_at_the_middle():
  requests = CHAT.requests_at(4, 1)
  half = len(requests) // 2

  def top(part):
    counts = Counter(r.key for r in part if not r.key.startswith('u'))
    return counts.most_common(1)[0][0]

  assert top(requests[:half]) != top(requests[half:])
  assert CHAT.epoch_of(half - 1) == 0 and CHAT.epoch_of(half) == 1
