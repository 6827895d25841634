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

"""Phase E: how keyed batching learns its batch sizes.

Two designs of keyed BatchElements, each the real DoFn of the patched tree:

* per_key, the reviewed pull request's: WithBatchKey(key_fn), then the
  stateful batching DoFn in its unkeyed mode, which keeps a target size and
  a _BatchSizeEstimator per state key and window, in state (a PickleCoder).
* per_step, patch 0006's: the same keying, then the DoFn in its keyed mode,
  which learns one target size per step and SDK process from the full
  batches of every key (_SharedBatchSize).

Neither local runner plays them faithfully: the FnApiRunner's state cache
hands every key of a bundle the estimator object it wrote, and the first
element of every key writes the DoFn's own, so per_key keys share one
estimator there; and the BundleBasedDirectRunner does not run the next step
inside the batching DoFn's yield, so record_time never sees the model's
time. So a small driver (Driver) plays one SDK worker of a fused streaming
runner such as Dataflow: elements are keyed by WithBatchKey's own process
method, then handed to the batching DoFn's process method, and buffering
timers fire its on_buffering_timer method, in processing-time order as a
fake clock passes them (a timer due at or before an arrival fires first).
State is the DirectRunner's: a value is encoded with its state spec's coder
when written and decoded when read, as on a distributed runner, so each
per_key key decodes its own estimator. The model runs inside the DoFn's
yield, on one server that serves batches one at a time: the driver moves the
clock on by a batch's cost before it resumes the DoFn, so record_time times
the model, and elements that arrive while the model is busy wait for it.

Elements arrive as a Poisson stream of RATE a second, with Zipf (ZIPF_S)
popular keys, ELEMENTS_PER_KEY a key on average. Both designs batch with
min_batch_size MIN_BATCH_SIZE, max_batch_size MAX_BATCH_SIZE and
BUFFERING_SECS of buffering (BatchElements' other defaults). A batch costs
the model BATCH_SECS plus ELEMENT_SECS an element, or CACHED_ELEMENT_SECS an
element when its key is among the CACHED_KEYS it served most recently (a
prefix cache). The figures of a run: the mean batch size, the share of
batches of one element, the model's seconds per element, the 99th
percentile of the delay from an element's arrival to the model starting its
batch, and the share of the run's time the model is busy. Each seed runs
both designs on the same arrivals; the summary gives each figure's median
over seeds and the median of the per-seed per_step over per_key ratios.

The pure parts (FakeClock, Model, arrivals, Driver, summarize) import only
the standard library, so that their tests run without Beam; BeamStep and
run import the tree.
"""

import collections
import heapq
import inspect
import itertools
import math
import random
import statistics
import warnings
import weakref

from bench.overhead import percentile

ELEMENTS_PER_KEY = 16
ZIPF_S = 1.1
# Elements a second, over all keys: just above the 1 / (BATCH_SECS +
# ELEMENT_SECS) = 1.8 a second the model could serve one at a time, so it
# keeps up only as far as the batching lets it.
RATE = 2.0
MIN_BATCH_SIZE, MAX_BATCH_SIZE = 1, 64
BUFFERING_SECS = 1
# The model: a batch costs BATCH_SECS plus ELEMENT_SECS an element, or
# CACHED_ELEMENT_SECS an element when its key was among the CACHED_KEYS most
# recently served.
BATCH_SECS, ELEMENT_SECS, CACHED_ELEMENT_SECS = 0.5, 0.05, 0.01
CACHED_KEYS = 16
# The seeds of each key count. The 160,000 elements of 10,000 keys vary
# least from seed to seed, and take per_key most of a minute.
SEEDS = {
    64: (1, 2, 3), 1024: (1, 2, 3), 10000: (1, )
}
QUICK_SEEDS = {
    64: (1, ), 1024: (1, )
}
DESIGNS = ('per_key', 'per_step')
FIGURES = (
    'mean_batch_size',
    'batches_of_one',
    'model_secs_per_element',
    'p99_delay_secs',
    'model_busy_share')

_clocks: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_clock_ids = itertools.count()


def _clock_named(name):
  return _clocks[name]


class FakeClock:
  """Processing time as the driver moves it.

  A pickled clock unpickles as the same clock while it lives, so that an
  estimator decoded from state still reads the driver's time.
  """
  def __init__(self, now: float = 0.0):
    self.now = now
    self._name = f'clock-{next(_clock_ids)}'
    _clocks[self._name] = self

  def __call__(self) -> float:
    return self.now

  def advance_to(self, when: float):
    """Moves the clock on to when, unless it is already past it."""
    self.now = max(self.now, when)

  def __reduce__(self):
    return _clock_named, (self._name, )


class Model:
  """One server that serves batches one at a time, with a prefix cache.

  A batch is a list of (key, arrival) elements of one key; serving it moves
  the clock on by its cost.
  """
  def __init__(self, clock: FakeClock):
    self._clock = clock
    self._recent: collections.OrderedDict = collections.OrderedDict()
    # (start, key, size, cost) of each batch served, in order.
    self.batches: list[tuple[float, str, int, float]] = []
    # Each element's wait, from its arrival to its batch's start.
    self.delays: list[float] = []

  def serve(self, batch: list):
    key = batch[0][0]
    cached = key in self._recent
    self._recent[key] = True
    self._recent.move_to_end(key)
    if len(self._recent) > CACHED_KEYS:
      self._recent.popitem(last=False)
    per_element = CACHED_ELEMENT_SECS if cached else ELEMENT_SECS
    cost = BATCH_SECS + per_element * len(batch)
    start = self._clock()
    self.batches.append((start, key, len(batch), cost))
    self.delays.extend(start - arrival for _, arrival in batch)
    self._clock.now = start + cost

  def figures(self, first_arrival: float) -> dict:
    if not self.batches:
      raise ValueError('the model served no batches')
    sizes = [size for _, _, size, _ in self.batches]
    busy = sum(cost for _, _, _, cost in self.batches)
    return {
        'mean_batch_size': sum(sizes) / len(sizes),
        'batches_of_one': sum(size == 1 for size in sizes) / len(sizes),
        'model_secs_per_element': busy / sum(sizes),
        'p99_delay_secs': percentile(self.delays, 99),
        'model_busy_share': busy / (self._clock() - first_arrival),
    }


def arrivals(keys: int, rate: float, seed: int) -> list[tuple[str, float]]:
  """keys * ELEMENTS_PER_KEY elements (key, arrival secs), a Poisson stream
  of rate a second with Zipf popular keys."""
  if keys < 1:
    raise ValueError(f'keys must be at least 1, got {keys!r}')
  if not rate > 0:
    raise ValueError(f'rate must be positive, got {rate!r}')
  rng = random.Random(f'{seed}/learning')
  weights = [1 / (rank + 1)**ZIPF_S for rank in range(keys)]
  drawn = rng.choices(range(keys), weights, k=keys * ELEMENTS_PER_KEY)
  now, elements = 0.0, []
  for key in drawn:
    now += rng.expovariate(rate)
    elements.append((f'prefix-{key}', now))
  return elements


class Driver:
  """Plays a batching step and the model on one worker of a fused runner.

  step is what the driver calls: keys(element) gives the (state key, element)
  pairs to process, process(pair) and fire(key) (the buffering timer) give
  the batches that a DoFn call emits, as it emits them, and timer(key) the
  key's buffering timer after a call (None when unset).
  The model serves each batch before the driver asks for the next, so a
  DoFn that times its yield times the model.
  """
  def __init__(self, step, model: Model, clock: FakeClock):
    self._step = step
    self._model = model
    self._clock = clock
    self._timers: list = []
    self._pushed: dict = {}
    self._order = itertools.count()

  def run(self, elements: list[tuple[str, float]]):
    """Feeds elements (key, arrival) in arrival order, and fires the
    buffering timers as the clock passes them, until none is left."""
    pending = iter(elements)
    element = next(pending, None)
    while element is not None or self._timers:
      due, _, key = self._timers[0] if self._timers else (math.inf, 0, None)
      if element is None or due <= element[1]:
        heapq.heappop(self._timers)
        if self._pushed.get(key) != due:
          continue  # Reset or cleared since.
        del self._pushed[key]
        self._clock.advance_to(due)
        self._serve(key, self._step.fire(key))
      else:
        self._clock.advance_to(element[1])
        for keyed in self._step.keys(element):
          self._serve(keyed[0], self._step.process(keyed))
        element = next(pending, None)

  def _serve(self, key, batches):
    for batch in batches:
      self._model.serve(batch)
    due = self._step.timer(key)
    if due is None:
      self._pushed.pop(key, None)
    elif due != self._pushed.get(key):
      self._pushed[key] = due
      heapq.heappush(self._timers, (due, next(self._order), key))


# The parameter name a DoFn method's TimestampParam maps to in BeamStep.
_TIMESTAMP = 'timestamp'


def _values(outputs):
  """The batches a DoFn call yields: a batch stamped with its window (as
  0006's keyed DoFn yields it since issue 24) unwrapped, lazily."""
  for output in outputs:
    yield output.value if hasattr(output, 'windows') else output


class BeamStep:
  """The real keying and batching DoFns, called as a runner would call them.

  Each state key gets the DirectRunner's runtime states and timers for the
  global window, which it keeps for the whole run, as within one long bundle:
  ReadModifyWrite and bag states encode a value with their spec's coder when
  it is written and decode it when it is read, so no two keys, and no two
  reads, share a value's object. (Committing them after each call, as the
  DirectRunner does after a bundle, took several times as long and gave the
  same figures.)
  """
  def __init__(self, key_fn, batching_dofn):
    from apache_beam.transforms import userstate
    from apache_beam.transforms import util
    from apache_beam.transforms.timeutil import TimeDomain
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.timestamp import Timestamp

    self._keying = util.WithBatchKey(key_fn)
    self._dofn = batching_dofn
    self._dofn.setup()
    self._window = GlobalWindow()
    # The elements' event time, which nothing here reads: batches are
    # served as the DoFn yields them, whatever their stamp.
    self._timestamp = Timestamp(0)
    self._state_specs, timer_specs = userstate.get_dofn_specs(batching_dofn)
    (self._buffering_spec, ) = [
        spec for spec in timer_specs if spec.time_domain == TimeDomain.REAL_TIME
    ]
    self._timer_specs = timer_specs
    on_buffering_timer = getattr(
        batching_dofn, self._buffering_spec._attached_callback.__name__)
    self._process = (
        batching_dofn.process, self._parameters(batching_dofn.process))
    self._on_buffering_timer = (
        on_buffering_timer, self._parameters(on_buffering_timer))
    # By state key: its runtime states and timers, by spec.
    self._keyed: dict = {}

  @staticmethod
  def _parameters(method):
    """The window, timestamp, state and timer parameters of a DoFn method,
    by name."""
    from apache_beam.transforms import core
    parameters = {}
    for name, parameter in inspect.signature(method).parameters.items():
      default = parameter.default
      if default == core.DoFn.WindowParam:
        parameters[name] = None
      elif default == core.DoFn.TimestampParam:
        parameters[name] = _TIMESTAMP
      elif isinstance(default, core._StateDoFnParam):
        parameters[name] = default.state_spec
      elif isinstance(default, core._TimerDoFnParam):
        parameters[name] = default.timer_spec
    return parameters

  def _states_and_timers(self, key):
    keyed = self._keyed.get(key)
    if keyed is None:
      from apache_beam.runners.direct import direct_userstate
      from apache_beam.transforms import userstate
      # Nothing committed: each state starts empty (list() reads no values).
      keyed = {
          spec: direct_userstate.DirectRuntimeState.for_spec(
              spec, spec.name, list)
          for spec in self._state_specs
      }
      keyed.update(
          (spec, userstate.RuntimeTimer()) for spec in self._timer_specs)
      self._keyed[key] = keyed
    return keyed

  def keys(self, element):
    return self._keying.process(element)

  def process(self, keyed_element):
    return self._call(self._process, keyed_element[0], keyed_element)

  def fire(self, key):
    # The runner consumes a timer that fires.
    self._states_and_timers(key)[self._buffering_spec]._timer_recordings.pop(
        '', None)
    return self._call(self._on_buffering_timer, key)

  def timer(self, key):
    recording = self._states_and_timers(key)[
        self._buffering_spec]._timer_recordings.get('')
    if recording is None or recording.cleared:
      return None
    return recording.timestamp

  def read(self, key, state_name):
    """The decoded value of one of key's states."""
    for spec, state in self._states_and_timers(key).items():
      if spec.name == state_name and spec in self._state_specs:
        return state.read()
    raise ValueError(f'no state named {state_name!r}')

  def _call(self, method_and_parameters, key, *args):
    method, parameters = method_and_parameters
    keyed = self._states_and_timers(key)
    kwargs = {
        name: self._window if spec is None else
        (self._timestamp if spec is _TIMESTAMP else keyed[spec])
        for name, spec in parameters.items()
    }
    return _values(method(*args, **kwargs) or ())


def batching_dofn(design: str, clock: FakeClock):
  """The stateful batching DoFn of design, as BatchElements builds it."""
  import typing

  from apache_beam import coders
  from apache_beam.transforms import util
  if design not in DESIGNS:
    raise ValueError(f'design must be one of {DESIGNS}, got {design!r}')
  estimator = util._BatchSizeEstimator(
      min_batch_size=MIN_BATCH_SIZE, max_batch_size=MAX_BATCH_SIZE, clock=clock)
  # 0006's keyed DoFn (per_step) has a factory of its own; the per-key
  # designs are 2.77.0's stateful DoFn, which learns per key.
  factory = (
      util._keyed_batch_elements_dofn
      if design == 'per_step' else util._pardo_stateful_batch_elements)
  return factory(
      coders.registry.get_coder(typing.Tuple[str, float]),
      estimator,
      BUFFERING_SECS,
      clock)


def _key(element):
  return element[0]


def run(design: str, elements: list[tuple[str, float]], seed: int) -> dict:
  """The figures of design over elements (key, arrival)."""
  clock = FakeClock(elements[0][1])
  model = Model(clock)
  step = BeamStep(_key, batching_dofn(design, clock))
  # The estimator draws its jitter from the global random, and numpy warns
  # of its ill-conditioned fits.
  saved = random.getstate()
  random.seed(f'{seed}/estimator')
  try:
    with warnings.catch_warnings():
      warnings.filterwarnings('ignore', module='apache_beam.transforms.util')
      Driver(step, model, clock).run(elements)
  finally:
    random.setstate(saved)
  return model.figures(elements[0][1])


def _ratio(numerator, denominator):
  return numerator / denominator if denominator else None


def _median(values):
  values = [v for v in values if v is not None]
  return statistics.median(values) if values else None


def summarize(results: dict) -> dict:
  """Figures by design, over the seeds of one key count, with per_step over
  per_key ratios taken seed by seed.

  results maps each design to its figures, one dict per seed, seeds in the
  same order.
  """
  summary = {}
  for design in DESIGNS:
    for figure in FIGURES:
      summary[f'{design}_{figure}'] = _median(
          r[figure] for r in results[design])
  pairs = list(zip(results['per_key'], results['per_step']))
  for figure in FIGURES:
    summary[f'per_step_over_per_key_{figure}'] = _median(
        _ratio(per_step[figure], per_key[figure])
        for per_key, per_step in pairs)
  summary['per_step_speedup'] = _median(
      _ratio(
          per_key['model_secs_per_element'], per_step['model_secs_per_element'])
      for per_key, per_step in pairs)
  return summary


def learning(quick: bool, progress) -> tuple[dict, dict]:
  seeds = QUICK_SEEDS if quick else SEEDS
  runs: dict = {}
  for keys, key_seeds in seeds.items():
    for seed in key_seeds:
      elements = arrivals(keys, RATE, seed)
      for design in DESIGNS:
        progress(f'E: {design}, {keys} keys, seed {seed}')
        results = runs.setdefault(str(keys), {}).setdefault(design, [])
        results.append(run(design, elements, seed))
  summary = {keys: summarize(results) for keys, results in runs.items()}
  return summary, {
      'rate': RATE,
      'elements_per_key': ELEMENTS_PER_KEY,
      'zipf_s': ZIPF_S,
      'batching': {
          'min_batch_size': MIN_BATCH_SIZE,
          'max_batch_size': MAX_BATCH_SIZE,
          'buffering_secs': BUFFERING_SECS,
      },
      'model': {
          'batch_secs': BATCH_SECS,
          'element_secs': ELEMENT_SECS,
          'cached_element_secs': CACHED_ELEMENT_SECS,
          'cached_keys': CACHED_KEYS,
      },
      'seeds': {str(keys): list(s) for keys, s in seeds.items()},
      'runs': runs,
  }
