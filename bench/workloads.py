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

"""The reference workloads, as timed requests (stdlib only).

A request's prompt is a chain of segments, each a whole number of
BLOCK_TOKENS-token blocks: the shared prefix (one segment, or a system
prompt then few-shot turns) and a suffix of its own. Blocks are named by
their segment, so a block is the same in every request whose chain holds
that segment, as vLLM's content hashing (which chains each block to the
ones before it) makes it.

W1 and W2 are the first benchmark's workloads, unchanged but for time:
requests now arrive as a Poisson process at a rate per worker. W3 is shaped
like chat traffic: nested prefixes of varying length, suffixes up to 1024
tokens, a share of unique prompts, and popularity that changes mid-run.
Benchmark v4 adds W0 (prompts that share nothing) and W4 (long documents
with questions), and sets every workload's regime R = S / C (at_ratio): S
is the tokens of its distinct shareable prefixes, C one worker's prefix
cache (CACHE_TOKENS).
"""

import bisect
import dataclasses
import itertools
import random
from typing import NamedTuple

# vLLM's CPU engine caches whole blocks of 32 tokens.
BLOCK_TOKENS = 32
MICROS = 1_000_000


class Request(NamedTuple):
  """One request: id, arrival (microseconds), batch key, the worker that
  reads it, and its prompt as ((segment, block count), ...)."""
  rid: int
  arrival_us: int
  key: str
  reader: int
  segments: tuple

  @property
  def tokens(self) -> int:
    return sum(n for _, n in self.segments) * BLOCK_TOKENS


# A segment is named by an int: its kind's code times SEGMENT_KINDS plus its
# index; a block by its segment times MAX_SEGMENT_BLOCKS plus its position.
SEGMENT_KINDS = 10**9
MAX_SEGMENT_BLOCKS = 4096
SHARED, SUFFIX, SYSTEM, FEWSHOT, OWN, DOCUMENT, QUESTION = 1, 2, 3, 4, 5, 6, 7
# The kinds of segment that more than one request can hold.
SHAREABLE = frozenset((SHARED, SYSTEM, FEWSHOT, DOCUMENT))
# Benchmark v4's C: one worker's prefix cache, a GPU-sized KV pool (an 8B
# model in fp16 needs about 128 KB per token: 16 GB).
CACHE_TOKENS = 131_072


def segment(kind: int, index: int) -> int:
  return kind * SEGMENT_KINDS + index


def _rng(seed, stream: str) -> random.Random:
  """An independent, seeded random stream per purpose."""
  return random.Random(f'{seed}/{stream}')


def zipf_weights(count: int, s: float) -> list[float]:
  return [1 / (rank + 1)**s for rank in range(count)]


def zipf_picker(rng: random.Random, population, s: float):
  """A function drawing from population with Zipf popularity; the same
  draws as rng.choices(population, zipf_weights(...)), in O(log n)."""
  cumulative = list(itertools.accumulate(zipf_weights(len(population), s)))
  total = cumulative[-1]
  last = len(population) - 1

  def pick():
    return population[min(
        bisect.bisect(cumulative, rng.random() * total), last)]

  return pick


def arrivals(count: int, rate_per_s: float, seed) -> list[int]:
  """Poisson arrival times in microseconds, strictly increasing."""
  rng = _rng(seed, 'arrivals')
  now, times = 0, []
  for _ in range(count):
    now += max(1, round(rng.expovariate(rate_per_s) * MICROS))
    times.append(now)
  return times


@dataclasses.dataclass(frozen=True)
class Workload:
  """A seeded reference workload: requests() draws its timed requests."""
  name: str
  requests: int
  workers: int
  cache_prefixes: int
  batch_size: int
  zipf_s: float

  @property
  def cache_blocks(self) -> int:
    """A worker's cache: room for cache_prefixes mean shared prefixes."""
    return round(self.cache_prefixes * self.mean_prefix_blocks)

  @property
  def mean_prefix_blocks(self) -> float:
    raise NotImplementedError

  @property
  def shareable_tokens(self) -> float:
    """S: the tokens of the distinct prefixes that requests can share
    (expected, where lengths are drawn)."""
    raise NotImplementedError

  def with_shareable_tokens(self, tokens: float) -> 'Workload':
    """The workload with S as close to tokens as its prefix count allows."""
    raise NotImplementedError

  def scaled(self, **changes) -> 'Workload':
    return dataclasses.replace(self, **changes)

  def describe(self) -> dict:
    return {
        **dataclasses.asdict(self),
        'block_tokens': BLOCK_TOKENS,
        'cache_blocks': self.cache_blocks,
    }

  def requests_at(self, rate_per_worker: float, seed) -> list[Request]:
    times = arrivals(self.requests, rate_per_worker * self.workers, seed)
    readers = _rng(seed, 'readers')
    return [
        Request(rid, at, key, readers.randrange(self.workers), segments)
        for rid, (at, (key,
                       segments)) in enumerate(zip(times, self.prompts(seed)))
    ]

  def prompts(self, seed) -> list[tuple[str, tuple]]:
    """(key, segments) of every request, in arrival order."""
    raise NotImplementedError

  def epoch_of(self, rid: int) -> int:
    """Which span of constant popularity a request belongs to."""
    return 0


@dataclasses.dataclass(frozen=True)
class FlatWorkload(Workload):
  """One shared prefix per request, drawn with Zipf popularity, then a
  suffix of its own; fixed lengths (the first benchmark's W1 and W2)."""
  prefixes: int = 64
  prefix_tokens: int = 1024
  suffix_tokens: int = 64

  @property
  def mean_prefix_blocks(self) -> float:
    return self.prefix_tokens // BLOCK_TOKENS

  @property
  def shareable_tokens(self):
    return self.prefixes * self.prefix_tokens

  def with_shareable_tokens(self, tokens):
    return self.scaled(prefixes=max(1, round(tokens / self.prefix_tokens)))

  def prompts(self, seed):
    rng = _rng(seed, 'prefixes')
    drawn = rng.choices(
        range(self.prefixes),
        zipf_weights(self.prefixes, self.zipf_s),
        k=self.requests)
    prefix_blocks = self.prefix_tokens // BLOCK_TOKENS
    suffix_blocks = self.suffix_tokens // BLOCK_TOKENS
    return [(
        f'p{p}',
        ((segment(SHARED,
                  p), prefix_blocks), (segment(SUFFIX, rid), suffix_blocks)))
            for rid, p in enumerate(drawn)]


@dataclasses.dataclass(frozen=True)
class ChatWorkload(Workload):
  """Chat-shaped traffic. A request's prefix is one of `systems` system
  prompts followed by one of `fewshots` shared few-shot conversations of
  that system prompt (the batch key names both); the pairs' popularity is
  Zipf over a random ranking that is redrawn at the middle of the run. A
  unique_share of requests have a prompt of their own. Lengths vary: system
  prompts and few-shot turns uniformly between their bounds, suffixes
  log-normally up to suffix_max_tokens."""
  systems: int = 8
  fewshots: int = 8
  system_tokens: tuple = (256, 1024)
  fewshot_tokens: tuple = (64, 512)
  suffix_max_tokens: int = 1024
  unique_share: float = 0.1

  def _lengths(self, seed):
    rng = _rng(seed, 'lengths')

    def blocks(bounds):
      low, high = bounds
      return rng.randint(low // BLOCK_TOKENS, high // BLOCK_TOKENS)

    systems = [blocks(self.system_tokens) for _ in range(self.systems)]
    fewshots = [[blocks(self.fewshot_tokens) for _ in range(self.fewshots)]
                for _ in range(self.systems)]
    return systems, fewshots

  @property
  def mean_prefix_blocks(self) -> float:
    return (sum(self.system_tokens) +
            sum(self.fewshot_tokens)) / (2 * BLOCK_TOKENS)

  @property
  def _tokens_per_system(self):
    return (
        sum(self.system_tokens) / 2 +
        self.fewshots * sum(self.fewshot_tokens) / 2)

  @property
  def shareable_tokens(self):
    return self.systems * self._tokens_per_system

  def with_shareable_tokens(self, tokens):
    return self.scaled(systems=max(1, round(tokens / self._tokens_per_system)))

  def epoch_of(self, rid):
    return int(rid >= self.requests // 2)

  def prompts(self, seed):
    systems, fewshots = self._lengths(seed)
    rng = _rng(seed, 'prompts')
    pairs = [(s, f) for s in range(self.systems) for f in range(self.fewshots)]
    max_suffix = self.suffix_max_tokens // BLOCK_TOKENS
    out = []
    for rid in range(self.requests):
      if rid in (0, self.requests // 2):
        # Popularity drifts: a new ranking of the pairs.
        ranking = rng.sample(pairs, len(pairs))
        pick = zipf_picker(rng, ranking, self.zipf_s)
      suffix = (
          segment(SUFFIX, rid),
          min(max_suffix, max(1, round(rng.lognormvariate(1.5, 0.8)))))
      if rng.random() < self.unique_share:
        own = rng.randint(*self.system_tokens) // BLOCK_TOKENS
        out.append((f'u{rid}', ((segment(OWN, rid), own), suffix)))
        continue
      s, f = pick()
      out.append((
          f's{s}f{f}',
          ((segment(SYSTEM, s), systems[s]),
           (segment(FEWSHOT, s * self.fewshots + f), fewshots[s][f]),
           suffix)))
    return out


W1 = FlatWorkload(
    'W1',
    requests=40_000,
    workers=8,
    cache_prefixes=8,
    batch_size=8,
    zipf_s=1.1,
    prefixes=64,
    prefix_tokens=1024,
    suffix_tokens=64)
W2 = FlatWorkload(
    'W2',
    requests=100_000,
    workers=64,
    cache_prefixes=16,
    batch_size=8,
    zipf_s=1.1,
    prefixes=1024,
    prefix_tokens=512,
    suffix_tokens=64)
W3 = ChatWorkload(
    'W3',
    requests=40_000,
    workers=16,
    cache_prefixes=8,
    batch_size=8,
    zipf_s=1.0)


@dataclasses.dataclass(frozen=True)
class UniqueWorkload(Workload):
  """W0: every prompt is its own (no shared prefix), so that every request
  gets a batch key of its own from a prefix key function."""
  prompt_tokens: int = 1024

  @property
  def mean_prefix_blocks(self) -> float:
    return self.prompt_tokens // BLOCK_TOKENS

  @property
  def shareable_tokens(self):
    return 0

  def with_shareable_tokens(self, tokens):
    return self

  def prompts(self, seed):
    blocks = self.prompt_tokens // BLOCK_TOKENS
    return [(f'u{rid}', ((segment(OWN, rid), blocks), ))
            for rid in range(self.requests)]


@dataclasses.dataclass(frozen=True)
class DocumentWorkload(Workload):
  """W4: questions about long documents. A request is one of `documents`
  documents, drawn with Zipf popularity, then a question of its own; a
  user key_fn keys it by the document."""
  documents: int = 64
  document_tokens: int = 2048
  question_tokens: int = 128

  @property
  def mean_prefix_blocks(self) -> float:
    return self.document_tokens // BLOCK_TOKENS

  @property
  def shareable_tokens(self):
    return self.documents * self.document_tokens

  def with_shareable_tokens(self, tokens):
    return self.scaled(documents=max(1, round(tokens / self.document_tokens)))

  def prompts(self, seed):
    pick = zipf_picker(
        _rng(seed, 'documents'), range(self.documents), self.zipf_s)
    document_blocks = self.document_tokens // BLOCK_TOKENS
    question_blocks = self.question_tokens // BLOCK_TOKENS
    out = []
    for rid in range(self.requests):
      d = pick()
      out.append((
          f'd{d}',
          ((segment(DOCUMENT, d), document_blocks),
           (segment(QUESTION, rid), question_blocks))))
    return out


def at_ratio(
    workload: Workload,
    ratio: float,
    cache_tokens: int = CACHE_TOKENS) -> Workload:
  """The workload in regime R = ratio: S = ratio x C."""
  if ratio <= 0:
    raise ValueError(f'ratio must be positive, got {ratio!r}')
  return workload.with_shareable_tokens(ratio * cache_tokens)


# Benchmark v4's workloads: W1-W3 as above (bench/v4.py sets their request
# counts and at_ratio their prefix counts), and these.
W0 = UniqueWorkload(
    'W0',
    requests=12_000,
    workers=8,
    cache_prefixes=128,
    batch_size=8,
    zipf_s=0.0,
    prompt_tokens=1024)
W4 = DocumentWorkload(
    'W4',
    requests=32_000,
    workers=8,
    cache_prefixes=64,
    batch_size=8,
    zipf_s=0.8,
    documents=256,
    document_tokens=2048,
    question_tokens=128)
