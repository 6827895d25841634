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
  bounded_run_batches batches, over up to bounded_max_shards shards: the
  input is bounded). The step holds a cold key's elements until the key
  turns warm (then they join its first shard) or its input ends (then
  they go to the cold state keys). With issue 24's default a key's first
  elements (until its count reaches bounded_own_batches_from, or the batch
  size if smaller) are cold; the keys that never get more fill the cold
  state keys of the process that measures them (cold_key) one after
  another, COLD_PACKED_BATCHES full batches each, which the batching step
  then runs as any key, mixing the cold keys' elements in their batches.
  A busy key is measured in parts (measuring_shards): each part measures,
  and runs, its elements as a key would, its shards start at a place of
  its own, and a part other than the first sends what it still holds at
  the input's end to its own first shard.
* measuring_shards: the part of a key that measures each element, as
  0013's _SpreadBatchKey picks it on bounded input: each reader (a DoFn
  instance of the step before, reading a contiguous split of the input)
  keeps a key's first MEASURED_WHOLE_BATCHES batches on part 0 and sends
  each further run to its next other part, from a place it draws.

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

# 0013's _COLD_PACKED_BATCHES, _MEASURING_SHARDS and _MEASURED_WHOLE_BATCHES.
COLD_PACKED_BATCHES = 8
MEASURING_SHARDS = 16
MEASURED_WHOLE_BATCHES = 2


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


def measuring_shards(
    requests, readers: int, batch_size: int, run_batches: int, salt) -> dict:
  """rid -> the measuring shard (part) of each request's key on bounded
  input, read by `readers` DoFn instances (see the module docstring). The
  tree's counts start afresh at 16,384 keys per instance, more than a
  reader here sees."""
  n = len(requests)
  whole = MEASURED_WHOLE_BATCHES * batch_size
  run = run_batches * batch_size
  out = {}
  for reader in range(readers):
    start = position(('reader', reader), salt) % (MEASURING_SHARDS - 1)
    counts: collections.Counter = collections.Counter()
    for request in requests[reader * n // readers:(reader + 1) * n // readers]:
      count = counts[request.key]
      counts[request.key] += 1
      if count >= whole:
        out[request.rid] = 1 + (start + (count - whole) // run) % (
            MEASURING_SHARDS - 1)
  return out


def two_stage_keys(
    spec,
    requests,
    batch_size: int,
    buffering_s=1.0,
    cold_key=None,
    measuring=None):
  """The state key of every request under a two-stage policy in a batch
  runner (see the module docstring); measuring: rid -> its measuring shard
  (none: 0)."""
  measuring = measuring or {}
  spec = policies.on_bounded_input(spec)
  route = policies.two_stage_from(
      spec, batch_size, buffering_s, cold_key=cold_key)
  max_shards = spec.max_shards

  def shard_of(shard, part):
    return (shard + part * max_shards // MEASURING_SHARDS) % max_shards

  def part_of(request):
    part = measuring.get(request.rid, 0)
    return request.key if part == 0 else (request.key, part), part

  keys = []
  for request in requests:
    measured, part = part_of(request)
    key = route(request._replace(key=measured, arrival_us=0))[0]
    if part and not _is_cold(key):
      key = (str(request.key), shard_of(key[1], part))
    keys.append(key)
  # On bounded input the step holds a cold key's elements until the key
  # turns warm, and then sends them to its first shard.
  first_warm: dict = {}
  held = collections.Counter()
  for request, key in zip(requests, keys):
    measured, _ = part_of(request)
    if not _is_cold(key):
      first_warm.setdefault(measured, key)
    else:
      held[measured] += 1
  # The keys that never do are released at the input's end, key by key, and
  # fill their measuring process's cold state keys one after another; a
  # part other than the first goes to its own first shard.
  pack = COLD_PACKED_BATCHES * batch_size
  packed: dict = {}
  slot_of: dict = {}
  out = []
  for request, key in zip(requests, keys):
    measured, part = part_of(request)
    if not _is_cold(key):
      out.append(key)
    elif measured in first_warm:
      out.append(first_warm[measured])
    elif part:
      out.append((str(request.key), shard_of(0, part)))
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
