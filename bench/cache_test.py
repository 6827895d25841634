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

"""Tests of the benchmark's prefix-cache models."""

import random

import pytest

from bench.cache import BlockCache
from bench.cache import PrefixCache
from bench.cache import blocks_of

A, B, C, D = 1, 2, 3, 4


@pytest.mark.parametrize('make', [BlockCache, PrefixCache])
def test_reuses_the_longest_cached_run_of_leading_blocks(make):
  cache = make(capacity_blocks=20)
  assert cache.serve([(A, 3), (B, 2)]) == 0
  assert cache.serve([(A, 3), (C, 2)]) == 3
  assert cache.serve([(A, 3), (B, 2)]) == 5
  assert cache.serve([(C, 2), (A, 3)]) == 5
  assert cache.serve([(D, 1), (A, 3)]) == 0, 'reuse stops at the first miss'


@pytest.mark.parametrize('make', [BlockCache, PrefixCache])
def test_evicts_the_least_recently_used_blocks_tail_first(make):
  cache = make(capacity_blocks=5)
  cache.serve([(A, 3)])
  cache.serve([(B, 2)])
  cache.serve([(C, 1)])  # evicts A's last block
  assert cache.serve([(A, 3)]) == 2
  # Putting A's last block back evicted B's last block, not its first.
  assert cache.serve([(B, 2)]) == 1


def test_segment_cache_answers_as_the_block_cache_does():
  rng = random.Random(7)
  for _ in range(100):
    capacity = rng.randint(1, 40)
    blocks, segments = BlockCache(capacity), PrefixCache(capacity)
    for request in range(200):
      chain = [(s, s % 5 + 1) for s in rng.sample(range(10), rng.randint(1, 3))]
      chain.append((100 + request, rng.randint(1, 4)))
      assert blocks.serve(chain) == segments.serve(chain)


def test_blocks_of_names_blocks_by_segment_and_position():
  assert blocks_of([(1, 2), (2, 1)]) == [4096, 4097, 8192]
  with pytest.raises(ValueError, match='too many blocks'):
    blocks_of([(1, 5000)])


@pytest.mark.parametrize('make', [BlockCache, PrefixCache])
def test_capacity_must_be_positive(make):
  with pytest.raises(ValueError, match='capacity_blocks'):
    make(0)


def test_a_segment_must_keep_its_length():
  # PrefixCache keeps a segment's cached blocks as one count, which only
  # holds for segments that requests use whole, at one length.
  cache = PrefixCache(16)
  cache.serve(((7, 4), ))
  assert cache.serve(((7, 4), )) == 4
  with pytest.raises(ValueError, match='segment 7 has 2 blocks, but 4'):
    cache.serve(((7, 2), ))
