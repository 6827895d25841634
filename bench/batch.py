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

"""Benchmark v4's batch deployment: how a batch runner batches (stdlib
only).

* stateless_batches: 2.77.0's stateless path, which the vLLM handlers use
  by default: every worker reads a contiguous split of the input and
  batches it in input order, batch_size elements at a time, with no
  shuffle. A salt rotates where the splits start.
* keyed_batches: the keyed stateful step as a batch runner runs it: the
  elements grouped by state key, a key's elements together, in input
  order, batch_size at a time and the rest as one last batch. The state
  keys are placed in contiguous ranges of hashed positions, cut by their
  work; a worker serves its ranges in order.
* two_stage_keys: the state key AdaptiveNumShards gives each element in a
  batch runner, where its measuring step sees a key's elements in one
  burst: every element at the same processing time, so the measured rate
  only grows, and a key's elements go to a new shard every run (of
  bounded_run_batches batches: the input is bounded). The step holds a
  cold key's elements until the key turns warm (then they join its first
  shard) or its input ends (then they go to the cold state keys). With
  issue 24's default a key's first elements (until its count reaches
  own_batches_from, or the batch size if smaller) are cold; the keys that
  never get more fill the cold state keys of the process that measures
  them (cold_key) one after another, COLD_PACKED_BATCHES full batches each,
  which the batching step then runs as any key, mixing the cold keys'
  elements in their batches.

bench/batch_model_test.py checks these batches against the FnApiRunner's.
"""

import collections
import random

from bench import policies
from bench.fleet import Batch
from bench.frames import cut_ranges
from bench.frames import position
from bench.workloads import BLOCK_TOKENS
from bench.workloads import SEGMENT_KINDS
from bench.workloads import SHAREABLE

# 0011's _COLD_PACKED_BATCHES.
COLD_PACKED_BATCHES = 8


def stateless_batches(requests, workers: int, batch_size: int, salt):
  """(batches, placement) of the stateless path."""
  n = len(requests)
  offset = position('splits', salt) % max(1, n // workers)
  ordered = requests[offset:] + requests[:offset]
  batches = []
  placement = {}
  for w in range(workers):
    split = ordered[w * n // workers:(w + 1) * n // workers]
    for i in range(0, len(split), batch_size):
      key = ('read', w, i)
      batches.append(Batch(w, key, split[i:i + batch_size], len(batches)))
      placement[key] = w
  return batches, placement


def two_stage_keys(
    spec, requests, batch_size: int, buffering_s=1.0, cold_key=None):
  """The state key of every request under a two-stage policy in a batch
  runner (see the module docstring)."""
  route = policies.two_stage_from(
      policies.on_bounded_input(spec),
      batch_size,
      buffering_s,
      cold_key=cold_key)
  keys = [route(r._replace(arrival_us=0))[0] for r in requests]
  # On bounded input the step holds a cold key's elements until the key
  # turns warm, and then sends them to its first shard.
  first_warm: dict = {}
  held = collections.Counter()
  for request, key in zip(requests, keys):
    if not _is_cold(key):
      first_warm.setdefault(request.key, key)
    else:
      held[request.key] += 1
  # The keys that never do are released at the input's end, key by key, and
  # fill their measuring process's cold state keys one after another.
  pack = COLD_PACKED_BATCHES * batch_size
  packed: dict = {}
  slot_of: dict = {}
  out = []
  for request, key in zip(requests, keys):
    if not _is_cold(key):
      out.append(key)
    elif request.key in first_warm:
      out.append(first_warm[request.key])
    else:
      if request.key not in slot_of:
        process = key[:-1]
        meter = packed.setdefault(process, [0, 0])
        if meter[1] >= pack:
          meter[0] += 1
          meter[1] = 0
        meter[1] += held[request.key]
        slot_of[request.key] = process + (meter[0], )
      out.append(slot_of[request.key])
  return out


def _is_cold(state_key) -> bool:
  return isinstance(state_key, tuple) and state_key[0] == 'cold'


def random_shard_keys(requests, shards: int, seed):
  """WithBatchKey with a fixed shard count: a shard drawn per element."""
  rng = random.Random(f'{seed}/batch-shards')
  return [(str(r.key), int(rng.random() * shards) if shards > 1 else 0)
          for r in requests]


def group(requests, state_keys, batch_size: int) -> dict:
  """state key -> its batches' requests, in input order."""
  members: dict = {}
  for request, key in zip(requests, state_keys):
    members.setdefault(key, []).append(request)
  return {
      key: [reqs[i:i + batch_size] for i in range(0, len(reqs), batch_size)]
      for key, reqs in members.items()
  }


def key_work(batches_of_key, model, decode_tokens, charges) -> float:
  """A state key's work as a batch runner's splitting would see it: its
  shareable prefixes once, every request's own tokens, overheads, decode
  and shuffles."""
  shared = {}
  tokens = 0
  requests = 0
  overhead = 0.0
  for batch in batches_of_key:
    overhead += model.batch_overhead(len(batch))
    for request in batch:
      requests += 1
      for seg, count in request.segments:
        if seg // SEGMENT_KINDS in SHAREABLE:
          shared[seg] = count
        else:
          tokens += count
  tokens += sum(shared.values())
  return (
      tokens * BLOCK_TOKENS + overhead + requests * (
          decode_tokens * model.decode_token_tokens +
          charges.shuffles * model.shuffle_tokens))


def keyed_batches(
    grouped: dict, workers: int, salt, weights: dict, placement=None):
  """(batches, placement): the state keys in ranges of hashed positions cut
  by weights (or the given placement), each worker's keys in position
  order, a key's batches together."""
  ordered = sorted(grouped, key=lambda k: position(k, salt))
  if placement is None:
    runs = cut_ranges([weights[k] for k in ordered], workers)
    placement = dict(zip(ordered, runs))
  batches = []
  for key in ordered:
    for reqs in grouped[key]:
      batches.append(Batch(placement[key], key, reqs, len(batches)))
  return batches, placement
