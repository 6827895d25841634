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

"""Tests of phase E: the clock, the model, the arrivals, the driver's order
of events and the summary; and, where the patched tree imports, the real
DoFns under the driver."""

import pickle
from collections import Counter

import pytest

from bench import learning
from bench.learning import BATCH_SECS
from bench.learning import BUFFERING_SECS
from bench.learning import CACHED_ELEMENT_SECS
from bench.learning import CACHED_KEYS
from bench.learning import ELEMENT_SECS


def cost(size, cached=False):
  return BATCH_SECS + size * (CACHED_ELEMENT_SECS if cached else ELEMENT_SECS)


class PairStep:
  """A stand-in batching step: batches each key's elements in pairs, or
  alone when its buffering timer (BUFFERING_SECS after the batch's first
  element) fires; logs its calls with the clock, and how long each batch
  took between its yield and its resumption."""
  def __init__(self, clock):
    self.clock = clock
    self.buffers = {}
    self.timers = {}
    self.log = []

  def keys(self, element):
    yield element[0], element

  def process(self, keyed_element):
    key, element = keyed_element
    self.log.append(('process', element, self.clock()))
    buffer = self.buffers.setdefault(key, [])
    buffer.append(element)
    if len(buffer) == 1:
      self.timers[key] = self.clock() + BUFFERING_SECS
    if len(buffer) == 2:
      yield from self._emit(key)

  def fire(self, key):
    self.log.append(('fire', key, self.clock()))
    yield from self._emit(key)

  def _emit(self, key):
    batch = self.buffers.pop(key)
    del self.timers[key]
    start = self.clock()
    yield batch
    self.log.append(('timed', len(batch), self.clock() - start))

  def timer(self, key):
    return self.timers.get(key)


def drive(elements, step_type=PairStep):
  clock = learning.FakeClock(elements[0][1])
  model = learning.Model(clock)
  step = step_type(clock)
  learning.Driver(step, model, clock).run(elements)
  return step.log, model


def test_a_pickled_clock_is_the_same_clock():
  clock = learning.FakeClock(5)
  assert pickle.loads(pickle.dumps(clock)) is clock
  clock.advance_to(7)
  assert clock() == 7
  clock.advance_to(6)
  assert clock() == 7


def test_the_model_costs_less_for_a_key_it_served_recently():
  clock = learning.FakeClock(10)
  model = learning.Model(clock)
  model.serve([('a', 9.0), ('a', 9.5)])
  assert clock() == pytest.approx(10 + cost(2))
  model.serve([('a', 10.0)])
  assert clock() == pytest.approx(10 + cost(2) + cost(1, cached=True))
  for other in range(CACHED_KEYS):
    model.serve([(f'k{other}', 0.0)])
  start = clock()
  model.serve([('a', 11.0)])
  # CACHED_KEYS other keys since: no longer cached.
  assert clock() - start == pytest.approx(cost(1))
  assert model.delays[:3] == [1.0, 0.5, pytest.approx(cost(2))]
  assert [size for _, _, size, _ in model.batches[:2]] == [2, 1]


def test_figures_of_a_run():
  clock = learning.FakeClock(0)
  model = learning.Model(clock)
  model.serve([('a', 0.0)])
  model.serve([('b', 0.0), ('b', 0.0), ('b', 0.0)])
  figures = model.figures(first_arrival=0.0)
  assert figures['mean_batch_size'] == 2
  assert figures['batches_of_one'] == 0.5
  assert figures['model_secs_per_element'] == pytest.approx(
      (cost(1) + cost(3)) / 4)
  assert figures['model_busy_share'] == 1
  # The last element waited for the first batch.
  assert figures['p99_delay_secs'] == pytest.approx(cost(1))
  with pytest.raises(ValueError, match='no batches'):
    learning.Model(clock).figures(0.0)


def test_arrivals_are_a_seeded_poisson_stream_of_zipf_keys():
  elements = learning.arrivals(64, 4.0, 1)
  assert elements == learning.arrivals(64, 4.0, 1)
  assert elements != learning.arrivals(64, 4.0, 2)
  assert len(elements) == 64 * learning.ELEMENTS_PER_KEY
  times = [arrival for _, arrival in elements]
  assert times == sorted(times)
  assert times[-1] / len(times) == pytest.approx(1 / 4.0, rel=0.1)
  counts = Counter(key for key, _ in elements)
  assert counts['prefix-0'] / counts['prefix-1'] == pytest.approx(
      2**learning.ZIPF_S, rel=0.25)
  with pytest.raises(ValueError, match='keys must be at least 1, got 0'):
    learning.arrivals(0, 4.0, 1)
  with pytest.raises(ValueError, match='rate must be positive, got 0'):
    learning.arrivals(64, 0, 1)


def test_timers_fire_as_the_clock_passes_them_before_later_arrivals():
  log, _ = drive([('a', 0.0), ('b', 0.5), ('c', 3.0)])
  assert log == [
      ('process', ('a', 0.0), 0.0),
      ('process', ('b', 0.5), 0.5),
      ('fire', 'a', 1.0),
      ('timed', 1, pytest.approx(cost(1))),
      # Due at 1.5, while the model served a's batch.
      ('fire', 'b', pytest.approx(1.0 + cost(1))),
      ('timed', 1, pytest.approx(cost(1))),
      ('process', ('c', 3.0), 3.0),
      ('fire', 'c', 4.0),
      ('timed', 1, pytest.approx(cost(1))),
  ]


def test_a_timer_due_at_an_arrival_fires_first():
  log, _ = drive([('a', 0.0), ('b', 1.0)])
  assert [entry[:2] for entry in log[:4]] == [
      ('process', ('a', 0.0)),
      ('fire', 'a'),
      ('timed', 1),
      ('process', ('b', 1.0)),
  ]


def test_the_model_runs_inside_the_yield_and_arrivals_wait_for_it():
  log, model = drive([('a', 0.0), ('a', 0.1), ('b', 0.2), ('a', 0.9)])
  served = 0.1 + cost(2)
  assert log[:4] == [
      ('process', ('a', 0.0), 0.0),
      ('process', ('a', 0.1), 0.1),
      # The batch's time, from its yield to its resumption, is the model's.
      ('timed', 2, pytest.approx(cost(2))),
      ('process', ('b', 0.2), pytest.approx(served)),
  ]
  assert model.delays[:2] == [pytest.approx(0.1), 0.0]
  # b's timer is set when b is processed, after the model is done.
  assert ('fire', 'b', pytest.approx(served + BUFFERING_SECS)) in log


def test_a_timer_that_was_cleared_or_reset_does_not_fire():
  # a's first batch fills before its timer (due at 1.0) and clears it; a's
  # next element sets it again, for 1.9.
  log, _ = drive([('a', 0.0), ('a', 0.1), ('a', 0.9)])
  fired = [entry for entry in log if entry[0] == 'fire']
  assert fired == [('fire', 'a', 0.9 + BUFFERING_SECS)]


def test_summary_takes_ratios_seed_by_seed():
  def figures(scale):
    return {figure: scale for figure in learning.FIGURES}

  results = {
      'per_key': [figures(2.0), figures(4.0), figures(1.0)],
      'per_step': [figures(1.0), figures(1.0), figures(1.0)],
  }
  summary = learning.summarize(results)
  assert summary['per_key_mean_batch_size'] == 2.0
  assert summary['per_step_p99_delay_secs'] == 1.0
  # Seed by seed: 1/2, 1/4 and 1/1; their median.
  assert summary['per_step_over_per_key_batches_of_one'] == 0.5
  assert summary['per_step_speedup'] == 2.0
  results['per_key'][1]['batches_of_one'] = 0.0
  summary = learning.summarize(results)
  # A ratio over zero is left out.
  assert summary['per_step_over_per_key_batches_of_one'] == 0.75


# The real DoFns under the driver: these need the patched tree on the path
# (PYTHONPATH=scripts:build/beam/sdks/python:. with the py311 env).


@pytest.fixture
def beam():
  util = pytest.importorskip('apache_beam.transforms.util')
  if not hasattr(util, '_keyed_batch_elements_dofn'):
    pytest.skip('needs the patched tree (build/beam/sdks/python) on the path')


def beam_drive(design, elements):
  clock = learning.FakeClock(elements[0][1])
  model = learning.Model(clock)
  dofn = learning.batching_dofn(design, clock)
  step = learning.BeamStep(learning._key, dofn)
  learning.Driver(step, model, clock).run(elements)
  return step, dofn, model


def busy_key_then_new_key():
  # 40 elements of a at once, then three of b, long after.
  return ([('a', i / 1000) for i in range(40)] + [('b', 100 + i / 1000)
                                                  for i in range(3)])


def sizes_of(model, key):
  return [size for _, batch_key, size, _ in model.batches if batch_key == key]


def test_per_key_keys_learn_apart_and_a_new_key_starts_at_the_minimum(beam):
  step, _, model = beam_drive('per_key', busy_key_then_new_key())
  assert sizes_of(model, 'a')[:5] == [1, 2, 4, 8, 16]
  # b starts again at min_batch_size, then doubles.
  assert sizes_of(model, 'b') == [1, 2]
  (a_key, _), = step.keys(('a', 0.0))
  (b_key, _), = step.keys(('b', 0.0))
  a_estimator = step.read(a_key, 'batch_estimator')
  assert len(a_estimator._data) == len(sizes_of(model, 'a'))
  assert len(step.read(b_key, 'batch_estimator')._data) == 2
  # Each read decodes a copy of its own.
  assert step.read(a_key, 'batch_estimator') is not a_estimator


def test_per_step_keys_share_what_the_step_learned(beam):
  _, dofn, model = beam_drive('per_step', busy_key_then_new_key())
  assert sizes_of(model, 'a')[:5] == [1, 2, 4, 8, 16]
  # b starts at the step's target: its three elements wait for its timer,
  # set by its first element.
  (batch, ) = [batch for batch in model.batches if batch[1] == 'b']
  assert batch[0] == pytest.approx(100 + BUFFERING_SECS)
  assert batch[2] == 3
  assert dofn._shared_batch_size.target_size > 3


@pytest.mark.parametrize('design', learning.DESIGNS)
def test_a_batch_is_timed_with_the_model_in_it(beam, design):
  step, dofn, model = beam_drive(design, [('a', 0.0), ('a', 0.1)])
  if design == 'per_key':
    (a_key, _), = step.keys(('a', 0.0))
    data = step.read(a_key, 'batch_estimator')._data
  else:
    data = dofn._shared_batch_size._estimator._data
  # The first element is a full batch of min_batch_size 1, the second is
  # cached and emitted by its timer.
  assert data[0] == (1, pytest.approx(cost(1)))
  assert [batch_cost for _, _, _, batch_cost in model.batches
          ] == [pytest.approx(cost(1)), pytest.approx(cost(1, cached=True))]


@pytest.mark.parametrize('design', learning.DESIGNS)
def test_every_element_is_served_once(beam, design):
  elements = learning.arrivals(32, learning.RATE, 1)
  _, _, model = beam_drive(design, elements)
  assert sum(size for _, _, size, _ in model.batches) == len(elements)
  assert len(model.delays) == len(elements)
  assert min(model.delays) >= 0


def test_unknown_design(beam):
  with pytest.raises(ValueError, match="design must be one of .* got 'x'"):
    learning.batching_dofn('x', learning.FakeClock())
