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

"""A model of a fleet of LLM servers and their prefix caches (stdlib only).

bench/run.py gets batches from the real Beam transforms, places each batch
on a worker, and replays every worker's batches through this model:

* A request is a shared prefix (drawn with Zipf popularity) followed by a
  suffix of its own, both whole numbers of 16-token blocks.
* Blocks are content-hashed as vLLM hashes them: a prefix's blocks are the
  same in every request that uses it, a suffix's blocks are its own.
* A worker's cache holds a fixed number of blocks and evicts the least
  recently used. A request reuses the longest run of leading blocks that is
  cached, computes the rest, and leaves all its blocks cached, its last
  blocks first in line for eviction (vLLM frees a request's blocks tail
  first). Requests of a batch are served in order, so the later ones reuse
  what the first one computed, as vLLM shares blocks between the requests it
  runs together.
"""

import collections
import dataclasses
import hashlib
import random

BLOCK_TOKENS = 16


@dataclasses.dataclass(frozen=True)
class Workload:
  """A fixed, seeded reference workload."""
  name: str
  prefixes: int
  zipf_s: float
  prefix_tokens: int
  suffix_tokens: int
  requests: int
  workers: int
  cache_prefixes: int
  batch_size: int
  seed: int = 40905

  @property
  def cache_blocks(self) -> int:
    """A worker's cache: room for cache_prefixes prefixes."""
    return self.cache_prefixes * self.prefix_tokens // BLOCK_TOKENS

  def scaled(self, requests: int) -> 'Workload':
    return dataclasses.replace(self, requests=requests)

  def prefix_of_requests(self) -> list[int]:
    """The prefix of every request, in arrival order."""
    rng = random.Random(self.seed)
    weights = [1 / (rank + 1)**self.zipf_s for rank in range(self.prefixes)]
    return rng.choices(range(self.prefixes), weights, k=self.requests)

  def blocks(self, request: int, prefix: int) -> list:
    return ([('prefix', prefix, i)
             for i in range(self.prefix_tokens // BLOCK_TOKENS)] +
            [('suffix', request, i)
             for i in range(self.suffix_tokens // BLOCK_TOKENS)])


W1 = Workload(
    'W1',
    prefixes=64,
    zipf_s=1.1,
    prefix_tokens=1024,
    suffix_tokens=64,
    requests=40_000,
    workers=8,
    cache_prefixes=8,
    batch_size=8)
W2 = Workload(
    'W2',
    prefixes=1024,
    zipf_s=1.1,
    prefix_tokens=512,
    suffix_tokens=64,
    requests=100_000,
    workers=64,
    cache_prefixes=16,
    batch_size=8)


class PrefixCache:
  """One server's prefix cache: LRU over content-hashed blocks."""
  def __init__(self, capacity_blocks: int):
    self._capacity = capacity_blocks
    self._blocks: collections.OrderedDict = collections.OrderedDict()

  def serve(self, blocks: list) -> int:
    """Serves one request; returns how many leading blocks were cached."""
    hits = 0
    for block in blocks:
      if block not in self._blocks:
        break
      hits += 1
    # vLLM frees a finished request's blocks tail first, so its last blocks
    # are the first to go and its prefix stays longest.
    for block in reversed(blocks):
      if block in self._blocks:
        self._blocks.move_to_end(block)
      else:
        self._blocks[block] = None
        if len(self._blocks) > self._capacity:
          self._blocks.popitem(last=False)
    return hits


def worker_of(state_key, workers: int) -> int:
  """Where a runner would route a state key: a stable hash over workers."""
  digest = hashlib.sha256(repr(state_key).encode()).digest()
  return int.from_bytes(digest[:8], 'big') % workers


@dataclasses.dataclass
class Batch:
  """A batch as a worker's server receives it: the (request, prefix) pairs,
  and when it is sent (the arrival index of its last request)."""
  worker: int
  requests: list

  @property
  def sent_at(self) -> int:
    return max(request for request, _ in self.requests)


def evaluate(workload: Workload, batches: list[Batch]) -> dict[str, float]:
  """Replays every worker's batches, in the order they are sent, through its
  cache; returns the figures of bench/run.py."""
  per_worker = collections.defaultdict(list)
  for batch in batches:
    per_worker[batch.worker].append(batch)
  hit_tokens = total_tokens = 0
  loads = [0] * workload.workers
  for worker, worker_batches in per_worker.items():
    cache = PrefixCache(workload.cache_blocks)
    for batch in sorted(worker_batches, key=lambda b: b.sent_at):
      for request, prefix in batch.requests:
        blocks = workload.blocks(request, prefix)
        hit_tokens += cache.serve(blocks) * BLOCK_TOKENS
        total_tokens += len(blocks) * BLOCK_TOKENS
        loads[worker] += 1
  pure = sum(1 for b in batches if len({p for _, p in b.requests}) == 1)
  return {
      'hit_rate': hit_tokens / total_tokens,
      'load_max_over_mean': max(loads) / (sum(loads) / len(loads)),
      'purity': pure / len(batches),
      'mean_batch_size': sum(len(b.requests) for b in batches) / len(batches),
  }


def bound(workload: Workload, prefixes: list[int]) -> dict[str, float]:
  """The best any batching can do: every distinct prefix computed once."""
  total = len(prefixes) * (workload.prefix_tokens + workload.suffix_tokens)
  computed = (
      len(set(prefixes)) * workload.prefix_tokens +
      len(prefixes) * workload.suffix_tokens)
  return {'hit_rate': 1 - computed / total}
