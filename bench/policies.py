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

"""How each strategy gives a request its state key (stdlib only).

Every route is a callable request -> (state key, 0), for
fleet.form_batches; the runner's placement of the state keys is the
frame's (bench.frames), so routes never name a worker.

* PerProcessKey: 2.77.0's stateful BatchElements: one UUID key per SDK
  process (WithSharedKey), so a request is batched under the key of the
  process that read it.
* CopiedShards: WithBatchKey with a num_shards spec as BatchElements takes
  it (None, an int, a mapping or a callable). A callable is deep-copied
  per DoFn copy (scope 'copy': what a runner that keeps DoFn instances
  does), per SDK process ('process': a table shared by a process's
  copies), once ('fleet'), or for every element ('element': the
  BundleBasedDirectRunner, which deserializes DoFns for every bundle, and
  a TestStream makes a bundle of every element).
* TwoStage: the two-stage policy. Stage 1 is keyed by the raw key, so one
  stateful DoFn sees all of a key's traffic: it measures the key's rate and
  picks the shard; stage 2 is keyed by (key, shard) and batches.
* KnownShares: shard counts from the run's own traffic (a reference that
  knows the future).
* OracleRoute (in fleet) and oracle_route: popularity-aware replicas.
"""

import copy
import dataclasses
import math
import random
from collections import Counter
from collections.abc import Mapping

from bench import fleet
from bench.frames import position
from bench.workloads import MICROS


class PerWorkerKey:
  """The committed benchmark's baseline: one shared key per worker."""
  def __call__(self, request):
    return ('shared', request.reader), 0


class PerProcessKey:
  """2.77.0's stateful path: the UUID key of the reading SDK process."""
  def __init__(self, copies):
    self._copies = copies

  def __call__(self, request):
    worker, process, _ = self._copies[request.rid]
    return ('uuid', worker, process), 0


class RandomPick:
  """WithBatchKey's rule: a shard drawn at random per element."""
  def __init__(self, seed):
    self._rng = random.Random(seed)

  def __call__(self, key, count):
    return int(self._rng.random() * count) if count > 1 else 0


class CopiedShards:
  """WithBatchKey with num_shards as BatchElements takes it; a callable is
  copied per scope ('copy', 'process' or 'fleet')."""
  def __init__(self, num_shards, copies, seed, scope='copy'):
    if scope not in ('copy', 'process', 'fleet', 'element'):
      raise ValueError(
          f'scope must be copy, process, fleet or element, got {scope!r}')
    self._spec = num_shards
    self._copies = copies
    self._scope = scope
    self._pick = RandomPick(f'{seed}/shards')
    self._learners: dict = {}

  def _learner(self, request):
    if self._scope == 'element':
      return copy.deepcopy(self._spec)
    worker, process, thread = self._copies[request.rid]
    at = {
        'copy': (worker, process, thread),
        'process': (worker, process),
        'fleet': None,
    }[self._scope]
    fn = self._learners.get(at)
    if fn is None:
      fn = self._learners[at] = copy.deepcopy(self._spec)
    return fn

  def count(self, request):
    count = fleet.fixed_shard_count(self._spec, request.key)
    if count is not None:
      return count
    return self._learner(request)(request.key)

  def __call__(self, request):
    shard = self._pick(request.key, self.count(request))
    return (str(request.key), shard), 0


# 0013's _COLD_MIN_SPAN_PERIODS.
COLD_MIN_SPAN_PERIODS = 4
# 0013's _COLD_SPLIT_FILLS: its _ColdKeys doubles a process's cold slots
# once each would fill this many batches (of max_batch_size, the batch size
# here) per buffering period.
COLD_SPLIT_FILLS = 4

# Where the model pools the default's cold keys in streaming: in the SDK
# process that measures them, as 0013 does, or in one meter for the whole
# fleet, whose slot count follows the fleet's cold traffic as a process's
# follows its own (a what-if of the model alone).
COLD_SCOPES = ('process', 'fleet')


def check_cold_scope(scope):
  if scope not in COLD_SCOPES:
    raise ValueError(f'cold_scope must be one of {COLD_SCOPES}, got {scope!r}')


def cold_key_of(seed, workers, processes, scope='process'):
  """key -> the cold state key of the SDK process that measures the key: a
  salted hash of the key over the fleet's workers x processes, the same
  for every placement of a seed; with scope 'fleet', the fleet's one cold
  state key."""
  check_cold_scope(scope)
  if scope == 'fleet':
    return lambda key: ('cold', )
  count = workers * processes

  def cold_key(key):
    return ('cold', position(('measuring', key), f'{seed}/m') % count)

  return cold_key


class TwoStage:
  """The two-stage policy (see bench/RESEARCH.md for its spec).

  Stage 1 keeps, per key, a time-decayed count of its elements (time
  constant tau_s, in the stage's processing time) and the time of its
  first element; the key's rate is the decayed count over the decayed
  time since its first element (at least min_span_s), and it gets
  ceil(rate / rate_per_shard) shards, at most max_shards (one while its
  rate is under split_from). With own_batches_from set (issue 24's
  default), a key whose rate brings fewer than own_batches_from elements
  (at most the batch size) per buffering period (per tau_s, if shorter)
  is cold, and cold again
  once warm only below half of that: its element goes to cold_key(key), the
  state key the cold keys of its measuring process share; a key that turns
  warm starts its runs at shard 0. The cold keys of a measuring process
  are spread over that process's cold slots, as 0013's _ColdKeys spreads
  them: the process's cold elements are counted as a key's are, and the
  slot count, a power of two at most max_shards, doubles once they bring
  four batches per buffering period per slot and halves once they bring
  fewer than one per slot; a key's slot is its hash modulo the count.
  Without own_batches_from (adaptive_v3, 0013 before issue 24) every key
  is warm. With
  pick='runs', a key's elements go to one shard in runs of run_length
  (a new run, on the next shard, when a run is full or older than
  run_timeout_s); with pick='random', a shard is drawn per element.
  """
  def __init__(
      self,
      rate_per_shard: float,
      *,
      tau_s: float = 30.0,
      min_span_s: float = 1.0,
      max_shards: int = 64,
      pick: str = 'runs',
      run_length: int = 8,
      run_timeout_s: float = 1.0,
      split_from: float = 0.0,
      own_batches_from=None,
      batch_size: int = 8,
      buffering_s: float = 1.0,
      cold_key=None,
      seed=0):
    if own_batches_from is not None and own_batches_from <= 0:
      raise ValueError(
          f'own_batches_from must be positive or None, got '
          f'{own_batches_from!r}')
    self.rate_per_shard = rate_per_shard
    self.own_batches_from = own_batches_from
    self.batch_size = batch_size
    self.buffering_s = buffering_s
    self.cold_key = cold_key or (lambda key: ('cold', 0))
    self.split_from = split_from
    self.tau_us = tau_s * MICROS
    self.min_span_us = min_span_s * MICROS
    self.max_shards = max_shards
    self.pick = pick
    self.run_length = run_length
    self.run_timeout_us = run_timeout_s * MICROS
    self._rng = random.Random(f'{seed}/two-stage')
    # key -> [decayed count, last time, first time, shard, in run, run start]
    self._state: dict = {}
    # cold key -> [decayed count, last time, first time, slot count]
    self._cold: dict = {}
    self._max_slots = 1 << (max_shards.bit_length() - 1)

  def _rate(self, state, now_us, min_span_us):
    """Counts an element at now_us in state (decayed count, last time,
    first time, ...); returns the rate, in elements per second, taken over
    at least min_span_us."""
    decay = math.exp(-(now_us - state[1]) / self.tau_us)
    state[0] = state[0] * decay + 1.0
    state[1] = now_us
    span = max(now_us - state[2], min_span_us)
    window_s = self.tau_us * (1 - math.exp(-span / self.tau_us)) / MICROS
    return state[0] / window_s

  def cold_state_key(self, key, now_us):
    """The cold slot of the key's measuring process that the key gets."""
    process = self.cold_key(key)
    meter = self._cold.get(process)
    if meter is None:
      meter = self._cold[process] = [0.0, now_us, now_us, 1]
    # As _ColdKeys, over at least COLD_MIN_SPAN_PERIODS buffering periods.
    rate = self._rate(
        meter,
        now_us,
        max(
            self.min_span_us,
            COLD_MIN_SPAN_PERIODS * self.buffering_s * MICROS))
    fills = rate * self.buffering_s / self.batch_size
    while fills >= COLD_SPLIT_FILLS * meter[3] and meter[3] < self._max_slots:
      meter[3] *= 2
    while fills < meter[3] and meter[3] > 1:
      meter[3] //= 2
    return process + (position(('cold-slot', key), 'slot') % meter[3], )

  def shards_of(self, key, now_us):
    """The key's shard count after counting an element at now_us (0: the
    key is cold)."""
    state = self._state.get(key)
    if state is None:
      state = self._state[key] = [0.0, now_us, now_us, -1, 0, now_us]
    rate = self._rate(state, now_us, self.min_span_us)
    if self.own_batches_from is not None:
      # 0013's _next_shard: cold below own_batches_from elements per
      # buffering period (or per decay period, if shorter), and below half
      # of it once warm.
      own = min(self.batch_size, self.own_batches_from)
      if state[3] >= 0:
        own /= 2
      if rate * min(self.buffering_s, self.tau_us / MICROS) < own:
        state[3], state[4] = -1, 0
        return state, 0
    if rate < self.split_from:
      return state, 1
    count = max(1, min(self.max_shards, math.ceil(rate / self.rate_per_shard)))
    return state, count

  def __call__(self, request):
    state, count = self.shards_of(request.key, request.arrival_us)
    if count == 0:
      # (A cold key's run start only moves its forget timer.)
      return self.cold_state_key(request.key, request.arrival_us), 0
    if self.pick == 'random':
      shard = int(self._rng.random() * count) if count > 1 else 0
    else:
      expired = request.arrival_us - state[5] >= self.run_timeout_us
      if state[3] < 0 or state[4] >= self.run_length or expired:
        state[3] = (state[3] + 1) % count
        state[4] = 0
        state[5] = request.arrival_us
      elif state[3] >= count:
        state[3] = state[3] % count
      state[4] += 1
      shard = state[3]
    return (str(request.key), shard), 0


class KnownShares:
  """ceil(share x factor x workers) shards per key, from the run's own
  traffic, picked at random or in runs of run_length."""
  def __init__(
      self, requests, workers, factor, seed, pick='random', run_length=8):
    counts = Counter(r.key for r in requests)
    total = len(requests)
    self._shards = {
        k: max(1, math.ceil(c / total * factor * workers))
        for k, c in counts.items()
    }
    self._pick = pick
    self._rng = random.Random(f'{seed}/known')
    self._run_length = run_length
    self._runs: dict = {}

  def __call__(self, request):
    count = self._shards[request.key]
    if self._pick == 'random':
      shard = int(self._rng.random() * count) if count > 1 else 0
    else:
      shard, left = self._runs.get(request.key, (-1, 0))
      if left == 0:
        shard, left = (shard + 1) % count, self._run_length
      self._runs[request.key] = (shard, left - 1)
    return (str(request.key), shard), 0


# What the bench reads of a two-stage policy from the tree: its public
# attributes, by these names (see bench/RESEARCH.md, the policy spec).
TWO_STAGE_ATTRIBUTES = ('rate_per_shard', 'max_shards', 'decay_secs')
TWO_STAGE_SHARDS_PER_BATCH_RATE = 4


def is_two_stage(spec) -> bool:
  return all(hasattr(spec, a) for a in TWO_STAGE_ATTRIBUTES)


class TwoStageSpec:
  """A two-stage policy as the tree's would be configured (its public
  attributes), for research before the tree has it."""
  def __init__(
      self,
      rate_per_shard=None,
      split_from=None,
      max_shards=64,
      decay_secs=30.0,
      run_batches=4,
      own_batches_from=None):
    self.rate_per_shard = rate_per_shard
    self.split_from = split_from
    self.max_shards = max_shards
    self.decay_secs = decay_secs
    self.run_batches = run_batches
    self.own_batches_from = own_batches_from

  def __repr__(self):
    return (
        f'TwoStageSpec(rate_per_shard={self.rate_per_shard}, '
        f'split_from={self.split_from}, max_shards={self.max_shards}, '
        f'decay_secs={self.decay_secs}, run_batches={self.run_batches}, '
        f'own_batches_from={self.own_batches_from})')


# The runs of 0013's AdaptiveNumShards as benchmark v4 first measured it.
ADAPTIVE_V3_RUN_BATCHES = 4


def adaptive_v3(spec):
  """The two-stage spec as benchmark v4 first measured it: 0013's
  AdaptiveNumShards before issue 24, every key warm (no cold keys) and
  runs of ADAPTIVE_V3_RUN_BATCHES batches."""
  return TwoStageSpec(
      rate_per_shard=spec.rate_per_shard,
      split_from=getattr(spec, 'split_from', 0.0),
      max_shards=spec.max_shards,
      decay_secs=spec.decay_secs,
      run_batches=ADAPTIVE_V3_RUN_BATCHES)


def two_stage_from(
    spec, batch_size, buffering_s, seed=0, cold_key=None) -> TwoStage:
  """The simulator's model of a two-stage policy object of the tree. A
  batch's rate is batch_size per buffering duration; rate_per_shard None is
  a quarter of it (TWO_STAGE_SHARDS_PER_BATCH_RATE), split_from None all of
  it. A run is run_batches batches, or run_batches buffering durations.
  A spec with own_batches_from (issue 24's) sends cold keys to
  cold_key(key), by default one process's ('cold', 0)."""
  batch_rate = batch_size / buffering_s
  rate = spec.rate_per_shard
  if rate is None:
    rate = batch_rate / TWO_STAGE_SHARDS_PER_BATCH_RATE
  split_from = getattr(spec, 'split_from', 0.0)
  if split_from is None:
    split_from = batch_rate
  run_batches = getattr(spec, 'run_batches', 1)
  return TwoStage(
      rate,
      tau_s=spec.decay_secs,
      min_span_s=buffering_s,
      max_shards=spec.max_shards,
      run_length=run_batches * batch_size,
      run_timeout_s=run_batches * buffering_s,
      split_from=split_from,
      own_batches_from=getattr(spec, 'own_batches_from', None),
      batch_size=batch_size,
      buffering_s=buffering_s,
      cold_key=cold_key,
      seed=seed)


def on_bounded_input(spec):
  """The spec that measures a batch pipeline's bounded input: the tree's
  runs of bounded_run_batches batches there, up to bounded_max_shards
  shards a key, and batches of its own from bounded_own_batches_from
  elements, where the tree has them (0013's BatchElements.expand)."""
  bounded = {
      name: getattr(spec, f'bounded_{name}')
      for name in ('run_batches', 'max_shards', 'own_batches_from')
      if getattr(spec, f'bounded_{name}', None) is not None
  }
  return dataclasses.replace(spec, **bounded) if bounded else spec


def learns_per_copy(spec) -> bool:
  """Whether each DoFn copy of the spec learns on its own."""
  return (
      callable(spec) and not isinstance(spec, (int, Mapping)) and
      not is_two_stage(spec))


def route_for(spec, copies, seed, *, batch_size, buffering_s, cold_key=None):
  """The route of BatchElements(key_fn=..., num_shards=spec)."""
  if is_two_stage(spec):
    return two_stage_from(spec, batch_size, buffering_s, seed, cold_key)
  return CopiedShards(spec, copies, seed, 'copy')


def describe(spec) -> str:
  if isinstance(spec, (int, type(None))):
    return repr(spec)
  return getattr(spec, '__qualname__', None) or repr(spec)


def oracle_group(state_key):
  """The replicas of one key in one span go to different workers."""
  if isinstance(state_key, tuple) and len(state_key) == 3:
    return state_key[:2]
  return None
