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

"""The real transforms on a streaming runner, against the fleet simulator.

Each run drives BatchElements from the patched tree (keyed: the keying
steps then the stateful batching DoFn; baseline: the stateful path with its
per-process key) on the streaming DirectRunner. A TestStream advances
processing time to each request's arrival and then adds it, and ends with
processing time well past every buffering timer. The DoFns' clock follows
processing time: it reads the arrival of the element being keyed or
batched (key_fn and element_size_fn show it each element). The shard draws
of WithBatchKey come from Python's global random generator, seeded before
the run as the simulator's picker is.

The simulator models each policy's lifecycle on this runner: the streaming
DirectRunner deserializes its DoFns for every bundle, and a TestStream
makes a bundle of every element, so a num_shards callable that learns in
its DoFn instance starts afresh for every element; a policy that keeps
what it learns in state does not. The stateless path is not validated: its
batches are the runner's bundles.

A run passes when the simulator forms exactly the same batches (the same
requests in each) from the same requests. The runner is one SDK process, so
issue 24's default has one cold state key there, the simulator's
('cold', 0); batches_cold counts the simulated batches of that key and
batches_mixed those that hold more than one key, so a run shows that it
exercised the cold keys' shared batches as well as warm keys' own.
"""

import random
import uuid
from collections import Counter

import apache_beam as beam
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger
from apache_beam.transforms import util
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Duration
from apache_beam.utils.timestamp import Timestamp
from bench import fleet
from bench import policies
from bench.workloads import MICROS
from bench.workloads import FlatWorkload

BUFFERING_S = 1
VALIDATION = FlatWorkload(
    'V',
    requests=240,
    workers=4,
    cache_prefixes=2,
    batch_size=4,
    zipf_s=1.1,
    prefixes=8,
    prefix_tokens=256,
    suffix_tokens=32)
RATE_PER_WORKER = 2.0


class ArrivalClock:
  """The batching steps' clock: the processing time at which the element
  being keyed or batched arrived. The key function and element_size_fn show
  it each element first. Every DoFn gets its own deserialized copy of the
  clock, so the copies share what they observed (by the clock's id): a
  stateful step that reads the clock but runs no user function, such as
  AdaptiveNumShards' shard step, sees the arrival the key function saw."""
  _now: dict = {}

  def __init__(self):
    self._id = uuid.uuid4().hex

  def observe(self, element):
    self._now[self._id] = Timestamp(micros=element[2])
    return 1

  def key(self, element):
    """The batch key, after observing the element's arrival."""
    self.observe(element)
    return element[1]

  def __call__(self):
    return self._now.get(self._id, Timestamp(0))


class _Collect(beam.DoFn):
  """Keeps every batch's request ids, in the bench process."""
  def __init__(self, sink):
    self._sink = sink

  def process(self, batch):
    _SINKS[self._sink].append(tuple(rid for rid, _, _ in batch))


_SINKS: dict = {}


def real_batches(requests, batch_size, num_shards, keyed, seed) -> list:
  """The batches (tuples of request ids) the real transforms emit."""
  stream = TestStream().advance_watermark_to(Timestamp(0))
  now = 0
  for request in requests:
    stream.advance_processing_time(Duration(micros=request.arrival_us - now))
    now = request.arrival_us
    stream.add_elements([
        window.TimestampedValue((request.rid, request.key, request.arrival_us),
                                Timestamp(micros=request.arrival_us))
    ])
  stream.advance_processing_time(Duration(seconds=10 * BUFFERING_S))
  stream.advance_watermark_to_infinity()
  clock = ArrivalClock()
  sink = f'{id(clock)}'
  _SINKS[sink] = []
  batching = (
      util.BatchElements(
          min_batch_size=batch_size,
          max_batch_size=batch_size,
          key_fn=clock.key,
          num_shards=num_shards,
          clock=clock,
          element_size_fn=clock.observe) if keyed else util.BatchElements(
              min_batch_size=batch_size,
              max_batch_size=batch_size,
              max_batch_duration_secs=BUFFERING_S,
              clock=clock,
              element_size_fn=clock.observe))
  pipeline = beam.Pipeline(
      runner='DirectRunner', options=StandardOptions(streaming=True))
  _ = (
      pipeline
      | stream
      | beam.WindowInto(
          window.GlobalWindows(),
          trigger=trigger.Repeatedly(trigger.AfterCount(1)),
          accumulation_mode=trigger.AccumulationMode.DISCARDING)
      | batching
      | beam.ParDo(_Collect(sink)))
  random.seed(f'{seed}/shards')
  pipeline.run().wait_until_finish()
  return _SINKS.pop(sink)


def on_the_millisecond(requests):
  """The requests, their arrivals moved to whole milliseconds (TestStream
  advances processing time in those) and apart, never exactly one buffering
  duration after another arrival, so that no timer is due at an arrival."""
  step = MICROS // 1000
  taken: set = set()
  out = []
  for request in requests:
    at = max(request.arrival_us // step * step, max(taken, default=0) + step)
    while at - BUFFERING_S * MICROS in taken:
      at += step
    taken.add(at)
    out.append(request._replace(arrival_us=at))
  return out


def simulated_batches(requests, batch_size, spec, name, seed):
  """The simulator's batches, each policy in its lifecycle on this runner
  (see the module docstring); one process reads everything."""
  copies = [(0, 0, 0)] * (max(r.rid for r in requests) + 1)
  if name == 'baseline':
    route = policies.PerProcessKey(copies)
  elif policies.learns_per_copy(spec):
    route = policies.CopiedShards(spec, copies, seed, 'element')
  else:
    route = policies.route_for(
        spec, copies, seed, batch_size=batch_size, buffering_s=BUFFERING_S)
  return fleet.form_batches(requests, route, batch_size, BUFFERING_S * MICROS)


def validate(quick: bool, strategies: dict, seed, progress) -> dict:
  """strategies: name -> num_shards spec ('baseline': 2.77.0's stateful
  path). Returns, per strategy, whether the simulator reproduced the real
  batches, with counts."""
  workload = VALIDATION.scaled(requests=80 if quick else VALIDATION.requests)
  requests = on_the_millisecond(workload.requests_at(RATE_PER_WORKER, seed))
  out = {}
  for name, num_shards in strategies.items():
    keyed = name != 'baseline'
    progress(
        f'V: {name} on the streaming DirectRunner, {len(requests)} requests')
    real = real_batches(requests, workload.batch_size, num_shards, keyed, seed)
    simulated = simulated_batches(
        requests, workload.batch_size, num_shards, name, seed)
    sim = [tuple(r.rid for r in b.requests) for b in simulated]
    full = sum(1 for b in sim if len(b) == workload.batch_size)
    out[name] = {
        'requests': len(requests),
        'num_shards': policies.describe(num_shards),
        'batches_real': len(real),
        'batches_simulated': len(sim),
        'batches_by_timer': len(sim) - full,
        'batches_full': full,
        'batches_cold': sum(1 for b in simulated if b.state_key[0] == 'cold'),
        'batches_mixed': sum(
            1 for b in simulated if len({r.key
                                         for r in b.requests}) > 1),
        'exact': Counter(real) == Counter(sim),
        'matching_batches': sum((Counter(real) & Counter(sim)).values()),
    }
  return {
      'workload': workload.describe(),
      'rate_per_worker': RATE_PER_WORKER,
      'seed': seed,
      'buffering_s': BUFFERING_S,
      'runner': 'DirectRunner (streaming)',
      'runs': out,
  }
