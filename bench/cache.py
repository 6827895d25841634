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

"""A server's prefix cache, as vLLM keeps it (stdlib only).

The cache holds a fixed number of content-hashed blocks and evicts the least
recently used. A request reuses the longest run of its leading blocks that
is cached, computes the rest, and leaves all its blocks cached, its last
blocks first in line for eviction (vLLM frees a finished request's blocks
tail first). The requests of a batch are served in order, so that the later
ones reuse what the first one computed, as vLLM shares blocks between the
requests it runs together.

BlockCache models exactly that, block by block. PrefixCache gives the same
answers per segment (a run of blocks that requests only ever use whole),
which is what makes full-scale runs fast: since a request touches all the
blocks of its segments, tail first, the cached blocks of a segment are
always a leading run of it, and the least recently used block is always the
last cached block of the least recently used segment.
"""

import collections

from bench.workloads import MAX_SEGMENT_BLOCKS


def blocks_of(segments) -> list[int]:
  """The blocks of a prompt given as ((segment, block count), ...)."""
  blocks = []
  for segment, count in segments:
    if count > MAX_SEGMENT_BLOCKS:
      raise ValueError(f'segment {segment} has too many blocks: {count}')
    first = segment * MAX_SEGMENT_BLOCKS
    blocks.extend(range(first, first + count))
  return blocks


def _check_capacity(capacity_blocks):
  if capacity_blocks < 1:
    raise ValueError(
        f'capacity_blocks must be positive, got {capacity_blocks!r}')


class BlockCache:
  """The reference model: LRU over single blocks."""
  def __init__(self, capacity_blocks: int):
    _check_capacity(capacity_blocks)
    self._capacity = capacity_blocks
    self._blocks: collections.OrderedDict = collections.OrderedDict()

  def serve(self, segments) -> int:
    """Serves one request; returns how many leading blocks were cached."""
    blocks = blocks_of(segments)
    cached = self._blocks
    hits = 0
    for block in blocks:
      if block not in cached:
        break
      hits += 1
    for block in reversed(blocks):
      if block in cached:
        cached.move_to_end(block)
      else:
        cached[block] = None
        if len(cached) > self._capacity:
          cached.popitem(last=False)
    return hits


class PrefixCache:
  """The same cache, kept per segment: segment -> its cached leading
  blocks, least recently used first."""
  def __init__(self, capacity_blocks: int):
    _check_capacity(capacity_blocks)
    self._capacity = capacity_blocks
    self._size = 0
    # Blocks evicted so far (benchmark v4's steady state counts them).
    self.evicted = 0
    self._segments: collections.OrderedDict = collections.OrderedDict()

  def serve(self, segments) -> int:
    """Serves one request; returns how many leading blocks were cached."""
    cached = self._segments
    hits = 0
    for segment, count in segments:
      held = cached.get(segment, 0)
      if held > count:
        raise ValueError(
            f'segment {segment} has {count} blocks, but {held} of it are '
            'cached: a segment keeps its length')
      hits += held
      if held < count:
        break
    for segment, count in reversed(segments):
      held = cached.get(segment)
      if held is None:
        cached[segment] = count
        self._size += count
      else:
        cached.move_to_end(segment)
        cached[segment] = count
        self._size += count - held
    while self._size > self._capacity:
      segment, held = next(iter(cached.items()))
      excess = self._size - self._capacity
      if held <= excess:
        cached.popitem(last=False)
        self._size -= held
        self.evicted += held
      else:
        cached[segment] = held - excess
        self._size -= excess
        self.evicted += excess
    return hits

  def __contains__(self, segment) -> bool:
    return segment in self._segments
