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

"""Tests of the differential suite's pipelines, on the apache_beam that is
installed (tox -e differential installs 2.77.0; the harness env has none,
and beampq's conftest leaves this module out there)."""

import time
import uuid

import apache_beam as beam
from beampq.gates import differential
from beampq.gates import differential_pipelines as pipelines


def _case(name):
  (case, ) = differential.cases(name)
  return case


def _sizes(result):
  return [len(batch['elements']) for batch in result['batches']]


def test_each_caller_draws_its_own_uuid_sequence():
  def shared_key():
    return pipelines._site_uuid4()  # pylint: disable=protected-access

  def elsewhere():
    return pipelines._site_uuid4()  # pylint: disable=protected-access

  pipelines._uuid_counts.clear()  # pylint: disable=protected-access
  first = shared_key()
  elsewhere()
  second = shared_key()
  pipelines._uuid_counts.clear()  # pylint: disable=protected-access
  assert shared_key() == first
  assert shared_key() == second != first
  assert first.version == 4


def test_run_case_restores_uuid4():
  uuid4 = uuid.uuid4
  pipelines.run_case(_case('stateless-global-fixed/FnApiRunner'))
  assert uuid.uuid4 is uuid4


def test_stateful_specs_list_the_states_and_timers():
  pipeline = beam.Pipeline()
  _ = (
      pipeline
      | beam.Create([1, 2, 3])
      | beam.transforms.util.BatchElements(max_batch_duration_secs=1))
  (specs, ) = pipelines.stateful_specs(pipeline.to_runner_api())
  assert 'values' in specs['states']
  assert specs['states']['values'][0] == 'bag_spec'
  assert set(specs['timers'].values()) == {'EVENT_TIME', 'PROCESSING_TIME'}
  # Pickled Python coders share one urn: the coder they hold tells them
  # apart (a state's coder change breaks an update in place).
  assert specs['states']['batch_estimator'][1] == [
      f'{pipelines.PICKLED_CODER_URN} PickleCoder'
  ]
  assert specs['states']['values'][1] == [
      f'{pipelines.PICKLED_CODER_URN} FastPrimitivesCoder'
  ]


def test_the_estimator_sees_the_model_s_time(monkeypatch):
  """The fake clock is shared by reference: the time the model step takes
  is what BatchElements measures, so it changes the batch sizes."""
  case = _case('stateless-global-adaptive/FnApiRunner')
  slow = _sizes(pipelines.run_case(case))
  monkeypatch.setattr(differential, 'MODEL_PER_ELEMENT_SECS', 0.0)
  fixed_cost_only = _sizes(pipelines.run_case(case))
  assert sum(slow) == sum(fixed_cost_only) == differential.ELEMENTS
  assert slow != fixed_cost_only


def test_buffering_timers_fire_on_the_streaming_runner():
  """The same pipeline with 2 s of buffering (less than the gap between
  bursts) emits more, smaller batches than with 1000 s."""
  buffered = pipelines.run_case(
      _case('stateful-global-adaptive/DirectRunner-streaming'))
  timed = pipelines.run_case(
      _case('stateful-global-timers/DirectRunner-streaming'))
  assert sum(_sizes(timed)) == sum(_sizes(buffered)) == differential.ELEMENTS
  assert len(timed['batches']) > len(buffered['batches'])


def test_a_forked_case_returns_its_result_and_its_time():
  result = pipelines.run_forked(_case('stateless-global-fixed/FnApiRunner'))
  assert _sizes(result) == [5] * (differential.ELEMENTS // 5)
  assert result['seconds'] > 0


def test_a_failing_case_returns_its_error(monkeypatch):
  monkeypatch.setitem(
      differential.CONFIGS,
      'inverted', {
          'windows': 1, 'batch': {
              'min_batch_size': 5, 'max_batch_size': 1
          }
      })
  result = pipelines.run_forked({
      'name': 'inverted/FnApiRunner',
      'config': 'inverted',
      'runner': 'FnApiRunner'
  })
  assert result['error'].startswith('Traceback')
  assert 'ValueError' in result['error']


def test_a_case_that_hangs_is_stopped(monkeypatch):
  monkeypatch.setattr(pipelines, 'run_case', lambda case: time.sleep(60))
  started = time.monotonic()
  result = pipelines.run_forked(
      _case('stateless-global-fixed/FnApiRunner'), timeout=1)
  assert result == {'error': 'timed out after 1 s'}
  assert time.monotonic() - started < 30
