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

"""The differential suite's pipelines, run against one tree's apache_beam.

differential.py starts this module once per tree, with that tree first on
PYTHONPATH, as `python -c` (not `-m`: the fake clock and the DoFns must be
pickled by reference to this module, so that every copy a runner makes
shares one clock). It imports apache_beam, then runs each case of
differential.CASES in a child forked from itself, so that nothing a tree
keeps per process (shared keys, estimators) carries from one case to the
next, and writes what each case's BatchElements emitted as JSON.

Every case reads the same elements: (arrival, timestamp, payload) triples,
arriving in bursts a few seconds apart. On the streaming DirectRunner a
TestStream advances the runner's processing time to each burst's arrival;
on every runner a Map before BatchElements moves the fake clock up to the
element's arrival, and the step after BatchElements (the "model") moves it
on by a batch's cost, so adaptive batch sizes and buffering timers see time
pass as a slow model would make it pass. `random` is seeded per case: the
batch size estimator draws its jitter from it. The unkeyed stateful path
keys elements by a per-process uuid4, and the FnApiRunner orders keys by
their hash: differential.py fixes PYTHONHASHSEED, and each case draws its
uuid4s from a sequence per calling function (_site_uuid4), so that the base
gives the same output on every run and a new uuid4 call elsewhere in a tree
does not change the shared key.
"""

import collections
import hashlib
import json
import os
import random
import select
import signal
import sys
import threading
import time
import traceback
import uuid

import apache_beam as beam
from apache_beam.coders import coders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.direct.direct_runner import DirectRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import window
from apache_beam.transforms.util import BatchElements
from apache_beam.utils import proto_utils
from beampq.gates import differential

# A case that takes longer than this is stopped and reported as an error.
CASE_TIMEOUT_SECS = 120


class _Clock:
  """The fake clock every copy of the pipeline's DoFns shares, in seconds."""
  def __init__(self):
    self.now = 0.0
    self.lock = threading.Lock()

  def advance_to(self, when):
    with self.lock:
      self.now = max(self.now, when)

  def advance_by(self, secs):
    with self.lock:
      self.now += secs


CLOCK = _Clock()
# What the model step saw, in the order it saw it.
EMITTED: list[dict] = []


def fake_clock():
  return CLOCK.now


def payload_length(payload):
  return len(payload)


def _arrive(element):
  """Moves the clock up to the element's arrival; keeps only its payload."""
  arrival, _, payload = element
  CLOCK.advance_to(arrival)
  return payload


def _window_of(w):
  if isinstance(w, window.GlobalWindow):
    return 'global'
  return [w.start.micros, w.end.micros]


class _Model(beam.DoFn):
  """The step after BatchElements: takes a model's time for each batch and
  records the batch as it was emitted."""
  def process(
      self, batch, timestamp=beam.DoFn.TimestampParam, w=beam.DoFn.WindowParam):
    CLOCK.advance_by(
        differential.MODEL_FIXED_SECS +
        differential.MODEL_PER_ELEMENT_SECS * len(batch))
    EMITTED.append({
        'elements': list(batch),
        'timestamp': timestamp.micros,
        'window': _window_of(w),
        'window_max_timestamp': w.max_timestamp().micros,
    })


def _runner(name):
  """The runner of a case, and its options."""
  if name == 'FnApiRunner':
    return FnApiRunner(), PipelineOptions([])
  if name == 'BundleBasedDirectRunner':
    return BundleBasedDirectRunner(), PipelineOptions([])
  if name == 'DirectRunner-streaming':
    return DirectRunner(), PipelineOptions([], streaming=True)
  raise ValueError(f'unknown runner {name!r}')


def _source(pipeline, runner_name):
  elements = differential.elements()
  if runner_name == 'DirectRunner-streaming':
    stream = TestStream().advance_watermark_to(0)
    now = 0.0
    for arrival, burst in differential.bursts(elements):
      if arrival > now:
        stream = stream.advance_processing_time(arrival - now)
        now = arrival
      stream = stream.add_elements(
          [window.TimestampedValue(e, e[1]) for e in burst])
    stream = stream.advance_processing_time(
        differential.FINAL_PROCESSING_ADVANCE_SECS)
    return pipeline | stream.advance_watermark_to_infinity()
  return (
      pipeline
      | beam.Create(elements, reshuffle=False)
      | 'Timestamp' >> beam.Map(lambda e: window.TimestampedValue(e, e[1])))


PICKLED_CODER_URN = 'beam:coder:pickled_python:v1'


def _batch_elements(config):
  kwargs = dict(config['batch'])
  if kwargs.pop('element_size_fn', None):
    kwargs['element_size_fn'] = differential.element_size
  if kwargs.pop('length_fn', None):
    kwargs['length_fn'] = payload_length
  return BatchElements(clock=fake_clock, **kwargs)


def _coder(components, coder_id):
  """A coder's urn and those of its components, without ids or payloads; a
  pickled Python coder (whose urn is the same for every such coder) also by
  the repr of the coder its payload holds, such as PickleCoder."""
  coder = components.coders[coder_id]
  urn = coder.spec.urn
  if urn == PICKLED_CODER_URN:
    urn += f' {coders.deserialize_coder(coder.spec.payload)!r}'
  return [urn] + [_coder(components, c) for c in coder.component_coder_ids]


def stateful_specs(pipeline_proto):
  """The state and timer specs of every stateful ParDo, by state name."""
  components = pipeline_proto.components
  found = []
  for transform in components.transforms.values():
    if transform.spec.urn != 'beam:transform:pardo:v1':
      continue
    payload = proto_utils.parse_Bytes(
        transform.spec.payload, beam_runner_api_pb2.ParDoPayload)
    if not payload.state_specs and not payload.timer_family_specs:
      continue
    states = {}
    for name, spec in sorted(payload.state_specs.items()):
      kind = spec.WhichOneof('spec')
      detail = getattr(spec, kind)
      coder_id = (
          getattr(detail, 'element_coder_id', '') or
          getattr(detail, 'accumulator_coder_id', '') or
          getattr(detail, 'coder_id', ''))
      states[name] = [kind, _coder(components, coder_id) if coder_id else []]
    timers = {
        name: beam_runner_api_pb2.TimeDomain.Enum.Name(spec.time_domain)
        for name, spec in sorted(payload.timer_family_specs.items())
    }
    found.append({'states': states, 'timers': timers})
  return sorted(found, key=lambda spec: json.dumps(spec, sort_keys=True))


_uuid_counts: collections.Counter = collections.Counter()


def _site_uuid4():
  """uuid.uuid4, drawn from a sequence of its own for each calling function
  (module and qualified name)."""
  code = sys._getframe(1).f_code  # pylint: disable=protected-access
  caller = sys._getframe(1).f_globals.get('__name__', '')  # pylint: disable=protected-access
  site = f'{caller}.{getattr(code, "co_qualname", code.co_name)}'
  _uuid_counts[site] += 1
  digest = hashlib.sha256(
      f'{differential.SEED}:{site}:{_uuid_counts[site]}'.encode()).digest()
  return uuid.UUID(bytes=digest[:16], version=4)


def run_case(case) -> dict:
  """Runs one case in this process; returns what BatchElements emitted."""
  random.seed(differential.SEED)
  _uuid_counts.clear()
  EMITTED.clear()
  CLOCK.now = differential.CLOCK_START[case['runner']]
  config = differential.CONFIGS[case['config']]
  runner, options = _runner(case['runner'])
  uuid4, uuid.uuid4 = uuid.uuid4, _site_uuid4
  try:
    pipeline = beam.Pipeline(runner=runner, options=options)
    pcoll = _source(pipeline, case['runner']) | 'Arrive' >> beam.Map(_arrive)
    if config['windows'] > 1:
      pcoll = pcoll | beam.WindowInto(
          window.FixedWindows(differential.WINDOW_SECS))
    _ = pcoll | _batch_elements(config) | beam.ParDo(_Model())
    specs = stateful_specs(pipeline.to_runner_api())
    pipeline.run().wait_until_finish()
  finally:
    uuid.uuid4 = uuid4
  return {'batches': list(EMITTED), 'specs': specs}


def _child(case, fd):
  try:
    result = run_case(case)
  except BaseException:  # pylint: disable=broad-except
    result = {'error': traceback.format_exc()}
  with os.fdopen(fd, 'w') as out:
    json.dump(result, out)


def run_forked(case, timeout=CASE_TIMEOUT_SECS) -> dict:
  """Runs one case in a child forked from this process (which has imported
  apache_beam and run nothing); returns its result or its error."""
  read, write = os.pipe()
  started = time.monotonic()
  pid = os.fork()
  if pid == 0:
    os.close(read)
    code = 0
    try:
      _child(case, write)
    except BaseException:  # pylint: disable=broad-except
      code = 1
    finally:
      os._exit(code)  # pylint: disable=protected-access
  os.close(write)
  chunks = []
  with os.fdopen(read, 'rb') as pipe:
    while True:
      left = started + timeout - time.monotonic()
      ready, _, _ = select.select([pipe], [], [], max(left, 0))
      if not ready:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return {'error': f'timed out after {timeout} s'}
      chunk = os.read(pipe.fileno(), 1 << 16)
      if not chunk:
        break
      chunks.append(chunk)
  _, status = os.waitpid(pid, 0)
  if not chunks:
    return {'error': f'the case exited without a result (status {status})'}
  result = json.loads(b''.join(chunks))
  result['seconds'] = round(time.monotonic() - started, 2)
  return result


def main(argv=None) -> int:
  import argparse
  parser = argparse.ArgumentParser(prog='differential_pipelines')
  parser.add_argument('--out', required=True)
  parser.add_argument(
      '-k', dest='select', help='only the cases whose name contains this')
  args = parser.parse_args(argv)
  results = {'apache_beam': beam.__file__, 'cases': {}}
  for case in differential.cases(args.select):
    results['cases'][case['name']] = run_forked(case)
  with open(args.out, 'w') as f:
    json.dump(results, f)
  return 0
