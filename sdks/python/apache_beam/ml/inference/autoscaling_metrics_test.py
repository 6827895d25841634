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

import collections
import gc
import heapq
import http.server
import math
import random
import threading
import time
import unittest
import uuid

from apache_beam.metrics.execution import MetricsEnvironment
from apache_beam.metrics.metricbase import MetricName
from apache_beam.ml.inference import autoscaling_metrics
from apache_beam.ml.inference.autoscaling_metrics import NUM_LOADED_MODELS_NAMESPACE
from apache_beam.ml.inference.autoscaling_metrics import AutoscalingConfig
from apache_beam.ml.inference.autoscaling_metrics import PrometheusNumLoadedModelsPublisher
from apache_beam.ml.inference.autoscaling_metrics import ServerMetricNames
from apache_beam.ml.inference.autoscaling_metrics import num_loaded_models_name

# The metric names of vLLM, as its handlers pass them.
VLLM_NAMES = ServerMetricNames(
    running='vllm:num_requests_running',
    waiting='vllm:num_requests_waiting',
    cache_usage='vllm:kv_cache_usage_perc',
    preemptions='vllm:num_preemptions_total',
    finished='vllm:request_success_total')
LABELS = 'engine="0",model_name="m"'


def num_loaded_models(tag):
  return MetricsEnvironment.process_wide_container().get_distribution(
      MetricName(NUM_LOADED_MODELS_NAMESPACE,
                 num_loaded_models_name(tag))).get_cumulative()


def process_wide_counter(namespace, name):
  return MetricsEnvironment.process_wide_container().get_counter(
      MetricName(namespace, name)).get_cumulative()


def vllm_text(
    running, waiting, usage=0.0, preemptions=0, finished=1, hits=0, queries=0):
  """A page like vLLM's /metrics."""
  return '\n'.join([
      '# HELP vllm:num_requests_running Requests in model execution.',
      '# TYPE vllm:num_requests_running gauge',
      f'vllm:num_requests_running{{{LABELS}}} {running}',
      '# TYPE vllm:num_requests_waiting gauge',
      f'vllm:num_requests_waiting{{{LABELS}}} {waiting}',
      '# TYPE vllm:kv_cache_usage_perc gauge',
      f'vllm:kv_cache_usage_perc{{{LABELS}}} {usage}',
      '# TYPE vllm:num_preemptions counter',
      f'vllm:num_preemptions_total{{{LABELS}}} {float(preemptions)}',
      '# TYPE vllm:request_success counter',
      f'vllm:request_success_total{{{LABELS},finished_reason="stop"}} '
      f'{float(finished)}',
      f'vllm:request_success_total{{{LABELS},finished_reason="abort"}} 0.0',
      '# TYPE vllm:prefix_cache_hits counter',
      f'vllm:prefix_cache_hits_total{{{LABELS}}} {float(hits)}',
      '# TYPE vllm:prefix_cache_queries counter',
      f'vllm:prefix_cache_queries_total{{{LABELS}}} {float(queries)}',
      f'vllm:e2e_request_latency_seconds_bucket{{{LABELS},le="+Inf"}} 4.0',
  ]) + '\n'


class _Request:
  __slots__ = ('prompt', 'left', 'generated', 'start', 'batch', 'entry')

  def __init__(self, prompt, length, batch):
    self.prompt, self.left, self.generated = prompt, length, 0
    self.start, self.batch, self.entry = 0.0, batch, None


class SimulatedVLLM:
  """A vLLM server in simulated time, advanced event by event.

  Continuous batching: up to max_num_seqs requests run, the others wait in a
  FIFO queue. Every step generates one token for each running request and
  takes step_secs + per_seq_secs * running seconds. The KV cache holds
  kv_tokens tokens: the prompt and generated tokens of every running request;
  a request is admitted when it fits below 99% of it, and when the cache is
  full the request admitted last is preempted, back at the head of the queue.
  """
  def __init__(
      self,
      max_num_seqs,
      kv_tokens,
      prompt_tokens=400,
      step_secs=0.08,
      per_seq_secs=0.001,
      now=0.0):
    self.max_num_seqs, self.kv_tokens = max_num_seqs, kv_tokens
    self.prompt_tokens = prompt_tokens
    self.step_secs, self.per_seq_secs = step_secs, per_seq_secs
    self.time, self.tokens = now, 0.0  # tokens generated per running request
    self.heap, self.admitted = [], []
    self.waiting = collections.deque()
    self.num_running, self.base = 0, 0.0  # KV used = base + running * tokens
    self.finished = self.preemptions = 0
    self.entries = 0
    self.running_time = 0.0  # the integral of the running count

  def used(self):
    return self.base + self.num_running * self.tokens

  def submit(self, batch, lengths):
    for length in lengths:
      self.waiting.append(_Request(self.prompt_tokens, length, batch))
    self._admit()

  def _admit(self):
    while self.waiting and self.num_running < self.max_num_seqs:
      request = self.waiting[0]
      need = request.prompt + request.generated
      if self.used() + need > 0.99 * self.kv_tokens:
        return
      self.waiting.popleft()
      request.start = self.tokens
      self.entries += 1
      request.entry = self.entries
      self.base += need - self.tokens
      self.num_running += 1
      heapq.heappush(
          self.heap, (self.tokens + request.left, request.entry, request))
      self.admitted.append(request)

  def advance(self, until):
    """Runs the server until the time until."""
    while self.num_running:
      step = self.step_secs + self.per_seq_secs * self.num_running
      while self.heap[0][2].entry != self.heap[0][1]:
        heapq.heappop(self.heap)
      done_at = self.heap[0][0]
      full_at = (self.kv_tokens - self.base) / self.num_running
      event = min(done_at, full_at)
      event_time = self.time + (event - self.tokens) * step
      if event_time > until:
        break
      self.running_time += (event_time - self.time) * self.num_running
      self.time, self.tokens = event_time, event
      if done_at <= full_at:
        self._finish(heapq.heappop(self.heap)[2])
      else:
        self._preempt()
      if self.waiting:
        self._admit()
    if self.num_running:
      step = self.step_secs + self.per_seq_secs * self.num_running
      self.tokens += (until - self.time) / step
      self.running_time += (until - self.time) * self.num_running
    self.time = until

  def _remove(self, request):
    self.num_running -= 1
    self.base -= request.prompt + request.generated - request.start
    request.entry = None

  def _finish(self, request):
    self._remove(request)
    self.finished += 1
    request.batch.request_done(self.time)

  def _preempt(self):
    request = self.admitted.pop()
    while request.entry is None:
      request = self.admitted.pop()
    progress = self.tokens - request.start
    self._remove(request)
    request.generated += progress
    request.left -= progress
    self.waiting.appendleft(request)
    self.preemptions += 1

  def fail_all(self):
    """A crash: every request of the server fails."""
    batches = {r.batch for r in self.waiting}
    batches.update(r.batch for _, entry, r in self.heap if r.entry == entry)
    for batch in batches:
      batch.fail(self.time)

  def metrics(self):
    # Without labels, which cost most of the parsing and are the same for
    # every server here.
    return (
        'vllm:num_requests_running %d\n'
        'vllm:num_requests_waiting %d\n'
        'vllm:kv_cache_usage_perc %r\n'
        'vllm:num_preemptions_total %d\n'
        'vllm:request_success_total %d\n' % (
            self.num_running,
            len(self.waiting),
            self.used() / self.kv_tokens,
            self.preemptions,
            self.finished))


class _Batch:
  __slots__ = ('thread', 'worker', 'left', 'size', 'done')

  def __init__(self, thread, worker, size):
    self.thread, self.worker, self.left, self.size = thread, worker, size, size
    self.done = False

  def request_done(self, now):
    self.left -= 1
    if not self.left:
      self.fail(now)

  def fail(self, now):
    if not self.done:
      self.done = True
      self.worker.batch_done(self, now)


# The servers of the three capacity cases, and the prior the vLLM handlers
# give the publisher: max_num_seqs when vllm_server_kwargs sets it, and when
# it does not, vLLM's own default for the machine (128 on a CPU).
CASES = {
    'max_num_seqs': dict(max_num_seqs=256, kv_tokens=10**7, prior=256),
    'kv_cache': dict(max_num_seqs=256, kv_tokens=50000, prior=256),
    'unknown_max_num_seqs': dict(max_num_seqs=128, kv_tokens=10**7, prior=128),
}
BATCH = 8
THREADS = 48
TICK_SECS = 60


class SimulatedWorker:
  """A worker: one simulated vLLM server and the real publisher, which polls
  it with the simulation's clock."""
  def __init__(self, pool, case, index):
    self.pool, self.case, self.index = pool, case, index
    self.server = None
    self.in_flight = 0
    self.published = []  # (time, value)
    self.measured = None  # the time of the first saturated interval
    self.down_until = None
    self.url = None
    self._start_server()
    self.publisher = PrometheusNumLoadedModelsPublisher(
        self.url,
        f'sim-{uuid.uuid4().hex}',
        VLLM_NAMES,
        AutoscalingConfig(max_running_requests=case['prior']),
        clock=lambda: pool.now,
        fetch=pool.fetch)

  def _start_server(self):
    self.server = SimulatedVLLM(
        self.case['max_num_seqs'], self.case['kv_tokens'], now=self.pool.now)
    self.url = f'http://127.0.0.1:{self.pool.next_port()}/metrics'
    self.pool.servers[self.url] = self.server

  def send(self, thread, now):
    batch = _Batch(thread, self, BATCH)
    self.in_flight += 1
    self.publisher.batch_started(BATCH)
    self.server.submit(batch, self.pool.lengths(BATCH))
    thread.busy = True

  def batch_done(self, batch, now):
    self.in_flight -= 1
    self.publisher.batch_finished(BATCH)
    self.pool.thread_free(batch.thread, self, now)

  def restart(self, down_secs):
    """The vLLM process dies; a new one answers down_secs later on a new
    port, and the server tells the publisher its new URL."""
    del self.pool.servers[self.url]
    self.server.fail_all()
    self.down_until = self.pool.now + down_secs

  def step(self, now):
    if self.down_until is not None:
      if now < self.down_until:
        return
      self.down_until = None
      self._start_server()
      self.publisher.set_metrics_url(self.url)
      self.pool.resend(self, now)
    self.server.advance(now)

  def poll(self):
    self.publisher._poll()
    if self.measured is None and self.publisher._samples:
      self.measured = self.pool.now
    if self.publisher.value is not None:
      self.published.append((self.pool.now, self.publisher.value))


class _Thread:
  __slots__ = ('index', 'busy', 'active')

  def __init__(self, index):
    self.index, self.busy, self.active = index, False, False


class ClosedLoop:
  """A pool of simulated workers driven by closed-loop threads (each sends a
  batch of BATCH requests and the next once all have answered, to the worker
  it is assigned) and an autoscaler: every TICK_SECS, desired =
  ceil(batches in flight / value), clamped to 1..64, where value is the mean
  of what the workers published since the last tick."""
  def __init__(self, case, workers, seed=0, lengths=(380, 420), autoscale=True):
    self.case = CASES[case] if isinstance(case, str) else case
    self.autoscale = autoscale
    self.now = 0.0
    self.rng = random.Random(seed)
    self.length_range = lengths
    self.servers = {}
    self._ports = 20000
    self.workers = []
    self.draining = []
    self.threads = [_Thread(i) for i in range(256)]
    self.pending = []
    self.ticks = []  # (time, batches in flight, workers after the tick)
    for _ in range(workers):
      self._add_worker()

  def next_port(self):
    self._ports += 1
    return self._ports

  def fetch(self, url):
    server = self.servers.get(url)
    if server is None:
      raise ConnectionRefusedError(111, 'Connection refused')
    return server.metrics()

  def lengths(self, count):
    low, high = self.length_range
    draw = self.rng.random
    return [low + int(draw() * (high - low + 1)) for _ in range(count)]

  def _add_worker(self):
    self.workers.append(SimulatedWorker(self, self.case, len(self.workers)))

  def assigned(self, thread):
    return self.workers[thread.index % len(self.workers)]

  def thread_free(self, thread, worker, now):
    thread.busy = False
    if not thread.active:
      return
    target = self.assigned(thread)
    if target is worker and worker.down_until is None:
      worker.send(thread, now)
    else:
      self.pending.append(thread)

  def resend(self, worker, now):
    for thread in self.threads:
      if thread.active and not thread.busy and self.assigned(thread) is worker:
        worker.send(thread, now)
    self.pending = [t for t in self.pending if not t.busy]

  def set_threads(self, count):
    for thread in self.threads:
      was = thread.active
      thread.active = thread.index < count
      if thread.active and not was and not thread.busy:
        self.pending.append(thread)

  def in_flight(self):
    return sum(t.active for t in self.threads)

  def _tick(self):
    values = [
        v for w in self.workers for t, v in w.published
        if t > self.now - TICK_SECS
    ]
    if values:
      value = sum(values) / len(values)
      desired = math.ceil(self.in_flight() / value)
      desired = min(64, max(1, desired))
      while len(self.workers) < desired:
        self._add_worker()
      while len(self.workers) > desired:
        self.draining.append(self.workers.pop())
    self.ticks.append((self.now, self.in_flight(), len(self.workers)))

  def run(self, secs, threads=None, step_secs=5):
    """Runs the loop for secs seconds with threads threads."""
    if threads is not None:
      self.set_threads(threads)
    end = self.now + secs
    while self.now < end - 1e-9:
      self.now += step_secs
      for worker in self.workers + self.draining:
        worker.step(self.now)
      self.draining = [w for w in self.draining if w.in_flight]
      pending, self.pending = self.pending, []
      for thread in pending:
        worker = self.assigned(thread)
        if thread.busy or not thread.active:
          continue
        if worker.down_until is None:
          worker.send(thread, self.now)
        else:
          self.pending.append(thread)
      for worker in self.workers:
        worker.poll()
      if self.autoscale and self.now % TICK_SECS < 1e-9:
        self._tick()

  def published(self, since=0.0):
    return [
        v for w in self.workers + self.draining for t, v in w.published
        if t >= since
    ]


def saturated_running(case, lengths=(380, 420)):
  """The simulated server's mean running count at saturation."""
  server = SimulatedVLLM(case['max_num_seqs'], case['kv_tokens'])
  rng = random.Random(1)
  low, high = lengths

  class Loop:
    def batch_done(self, batch, now):
      server.submit(_Batch(None, self, BATCH), draw())

  def draw():
    return [rng.randint(low, high) for _ in range(BATCH)]

  loop = Loop()
  for _ in range(64):
    server.submit(_Batch(None, loop, BATCH), draw())
  warmup = 20 * high * (server.step_secs + 256 * server.per_seq_secs)
  server.advance(warmup)
  start = server.running_time
  server.advance(2 * warmup)
  return (server.running_time - start) / warmup


class ClosedLoopTest(unittest.TestCase):
  """The real estimator against simulated vLLM servers and an autoscaler, at
  the default settings; every goal in each of the three capacity cases."""
  @classmethod
  def setUpClass(cls):
    cls.truth = {
        case: saturated_running(config) / BATCH
        for case, config in CASES.items()
    }
    cls.figures = {}

  @classmethod
  def tearDownClass(cls):
    for line in sorted(cls.figures.items(), key=str):
      print('closed loop %s: %s' % line)

  def test_true_capacities(self):
    self.assertAlmostEqual(self.truth['max_num_seqs'], 32, delta=0.5)
    self.assertLessEqual(self.truth['kv_cache'], 16)
    self.assertAlmostEqual(self.truth['unknown_max_num_seqs'], 16, delta=0.5)

  def check_units(self, loop, truth):
    """After a worker's first saturated interval, its value is never above
    twice the true capacity, and never 1 or 0."""
    for worker in loop.workers + loop.draining:
      if worker.measured is None:
        continue
      after = [v for t, v in worker.published if t >= worker.measured]
      if after:
        self.assertLessEqual(max(after), 2 * truth)
        self.assertGreater(min(after), 1)

  def test_convergence_and_stability(self):
    for case in CASES:
      truth = self.truth[case]
      target = math.ceil(THREADS / truth)
      for start in (1, 4, 16, 48):
        with self.subTest(case=case, start=start):
          loop = ClosedLoop(case, start, seed=start)
          loop.run(600, threads=THREADS)
          converged = [t for t, _, n in loop.ticks if n == target]
          self.assertTrue(converged, (case, start, loop.ticks))
          # An hour: steady load, a lull, an idle period longer than the
          # window, a burst of half as much again, steady again.
          hour_start = loop.now
          for secs, threads in ((900, THREADS), (600, 6), (600, 0),
                                (600, THREADS * 3 // 2), (900, THREADS)):
            loop.run(secs, threads=threads)
          for t, in_flight, workers in loop.ticks:
            if t > hour_start:
              expected = max(1, math.ceil(in_flight / truth))
              self.assertLessEqual(
                  abs(workers - expected), 1, (case, start, t, loop.ticks))
          self.check_units(loop, truth)
          values = loop.published(since=converged[0])
          self.figures[(case, start)] = (
              'converged at %d s, %d workers (target %d); published after '
              'min %d max %d; true capacity %.1f' %
              (converged[0], target, target, min(values), max(values), truth))

  def test_a_wrong_prior_is_corrected_by_measurement(self):
    # The prior says 256 requests (vLLM's usual default) where the server
    # runs 128: the pool shrinks until servers saturate, which measures them.
    # A burst is left out: the workers it adds publish the prior until they
    # saturate, which can leave the pool two workers short for two ticks.
    case = dict(CASES['unknown_max_num_seqs'], prior=256)
    truth = saturated_running(case) / BATCH
    target = math.ceil(THREADS / truth)
    for start in (1, 48):
      with self.subTest(start=start):
        loop = ClosedLoop(case, start, seed=start)
        loop.run(600, threads=THREADS)
        converged = [t for t, _, n in loop.ticks if n == target]
        self.assertTrue(converged, (start, loop.ticks))
        hour_start = loop.now
        for secs, threads in ((600, THREADS), (300, 6), (400, 0),
                              (600, THREADS)):
          loop.run(secs, threads=threads)
        for t, in_flight, workers in loop.ticks:
          if t > hour_start:
            expected = max(1, math.ceil(in_flight / truth))
            self.assertLessEqual(abs(workers - expected), 1, (start, t))
        self.check_units(loop, truth)
        self.figures[('wrong_prior', start)] = (
            'converged at %d s, %d workers' % (converged[0], target))

  def test_holding_through_a_lull(self):
    for case in CASES:
      truth = self.truth[case]
      with self.subTest(case=case):
        loop = ClosedLoop(case, 1)
        loop.run(300, threads=THREADS)
        lull = loop.now
        loop.run(3 * 300, threads=2)
        values = loop.published(since=lull)
        self.assertGreaterEqual(min(values), 0.75 * truth)
        self.assertLessEqual(max(values), 1.25 * truth)
        self.figures[(case, 'lull')] = (
            'held %d to %d through 15 minutes at 2 threads' %
            (min(values), max(values)))

  def test_requests_longer_than_the_window(self):
    # Outputs of 4,000 to 6,000 tokens take 6 to 10 minutes. In the KV case
    # the cache is 6 times larger, as requests this long hold 6 times more.
    lengths = (4000, 6000)
    for name, config in CASES.items():
      if name == 'kv_cache':
        config = dict(config, kv_tokens=6 * config['kv_tokens'])
      truth = saturated_running(config, lengths) / BATCH
      with self.subTest(case=name):
        loop = ClosedLoop(config, 1, lengths=lengths)
        loop.run(3600, threads=THREADS)
        self.check_units(loop, truth)
        self.assertIsNotNone(loop.workers[0].measured)

  def test_restart_keeps_the_value(self):
    for case in CASES:
      truth = self.truth[case]
      target = math.ceil(THREADS / truth)
      with self.subTest(case=case):
        loop = ClosedLoop(case, 1)
        loop.run(900, threads=THREADS)
        worker = loop.workers[0]
        before = worker.publisher.value
        restart = loop.now
        worker.restart(down_secs=90)
        loop.run(900)
        values = [v for t, v in worker.published if t > restart]
        self.assertGreaterEqual(min(values), 0.75 * min(before, truth))
        self.assertLessEqual(max(values), 1.25 * max(before, truth))
        for t, _, workers in loop.ticks:
          if t > restart:
            self.assertLessEqual(abs(workers - target), 1)

  def test_stragglers_count_as_batches_in_flight(self):
    # Output lengths from 20 to 400 tokens: a batch holds its last requests
    # long after the others finished, so the server serves more batches at
    # once than its running count over the batch size (32 here).
    lengths = (20, 400)
    truth = threads_served_without_queueing(CASES['max_num_seqs'], lengths)
    loop = ClosedLoop('max_num_seqs', 1, lengths=lengths, autoscale=False)
    loop.run(1200, threads=96)
    value = loop.workers[0].publisher.value
    self.assertIsNotNone(loop.workers[0].measured)
    self.assertGreater(truth, 1.25 * 256 / BATCH)
    self.assertGreaterEqual(value, 0.75 * truth)
    self.assertLessEqual(value, 1.25 * truth)
    self.figures[('stragglers', 1)] = (
        'published %d; one server serves %d threads with requests waiting '
        'at under 10%% of its scrapes' % (value, truth))


def threads_served_without_queueing(case, lengths):
  """The most closed-loop threads one simulated server serves with requests
  waiting at under 10% of its scrapes: its true capacity in batches."""
  def queueing(threads):
    loop = ClosedLoop(case, 1, seed=threads, lengths=lengths, autoscale=False)
    loop.set_threads(threads)
    waiting = []
    for _ in range(240):
      loop.run(5)
      waiting.append(len(loop.workers[0].server.waiting) > 0)
    return sum(waiting[60:]) / len(waiting[60:])

  low, high = 8, 256  # served, not served
  while high - low > 1:
    middle = (low + high) // 2
    if queueing(middle) < 0.1:
      low = middle
    else:
      high = middle
  return low


class EstimatorTest(unittest.TestCase):
  """The estimator, scrape by scrape, with an injected clock and page."""
  def setUp(self):
    self.now = 0.0
    self.page = vllm_text(0, 0)

  def publisher(self, **config):
    publisher = PrometheusNumLoadedModelsPublisher(
        'http://sim/metrics',
        uuid.uuid4().hex,
        VLLM_NAMES,
        AutoscalingConfig(**config),
        clock=lambda: self.now,
        fetch=self.fetch)
    return publisher

  def fetch(self, url):
    if isinstance(self.page, Exception):
      raise self.page
    return self.page

  def poll(self, publisher, times=1, secs=5):
    for _ in range(times):
      self.now += secs
      publisher._poll()

  def test_below_saturation_publishes_the_prior_not_the_load(self):
    publisher = self.publisher(max_running_requests=256, batch_size=8)
    for batches in (1, 2, 8, 25):
      while publisher._batches_in_flight < batches:
        publisher.batch_started(8)
      self.page = vllm_text(8 * batches, 0)
      self.poll(publisher, 3)
      self.assertEqual(publisher.value, 32)
    # The prior counts batches of the size sent: 256 requests in batches of 4.
    for _ in range(25):
      publisher.batch_started(0)
    self.poll(publisher)
    self.assertEqual(publisher.value, 64)

  def test_prior_assumes_the_batch_size_before_the_first_batch(self):
    publisher = self.publisher(max_running_requests=256, batch_size=16)
    self.poll(publisher)
    self.assertEqual(publisher.value, 16)

  def test_nothing_is_published_without_a_prior_until_measured(self):
    publisher = self.publisher()
    self.poll(publisher, 3)
    self.assertIsNone(publisher.value)
    for _ in range(40):
      publisher.batch_started(8)
    self.page = vllm_text(160, 160)
    self.poll(publisher, 2)
    self.assertEqual(publisher.value, 20)

  def test_saturation_by_waiting_cache_or_preemptions(self):
    pages = {
        'waiting': (vllm_text(128, 64), vllm_text(128, 64)),
        'cache': (vllm_text(128, 0, usage=0.95), vllm_text(128, 0, 0.92)),
        'preemptions': (
            vllm_text(128, 0, preemptions=3), vllm_text(128, 0, preemptions=5)),
        'waiting_at_one_end': (vllm_text(128, 64), vllm_text(128, 0)),
        'cache_at_one_end': (vllm_text(128, 0, 0.95), vllm_text(128, 0, 0.5)),
    }
    expected = {
        'waiting': 16,
        'cache': 24,
        'preemptions': 24,
        'waiting_at_one_end': None,
        # Not saturated: the cache usage gives a prior, the running count at
        # which the cache would be full, in batches.
        'cache_at_one_end': round((128 / 0.95 + 128 / 0.5) / 2 / 8),
    }
    for kind, (first, second) in pages.items():
      with self.subTest(kind):
        publisher = self.publisher()
        for _ in range(24):
          publisher.batch_started(8)
        self.page = first
        self.poll(publisher)
        self.page = second
        self.poll(publisher)
        self.assertEqual(publisher.value, expected[kind])

  def test_target_utilization_leaves_headroom(self):
    publisher = self.publisher(max_running_requests=256, target_utilization=0.5)
    for _ in range(24):
      publisher.batch_started(8)
    self.page = vllm_text(128, 64)
    self.poll(publisher, 2)
    self.assertEqual(publisher.value, 8)

  def test_measurement_is_held_then_the_prior_returns(self):
    publisher = self.publisher(max_running_requests=256)
    for _ in range(24):
      publisher.batch_started(8)
    self.page = vllm_text(128, 64)
    self.poll(publisher, 3)
    self.assertEqual(publisher.value, 16)
    for _ in range(24):
      publisher.batch_finished(8)
    self.page = vllm_text(0, 0)
    self.poll(publisher, 3599 // 5 - 2)
    self.assertEqual(publisher.value, 16)
    with self.assertLogs(autoscaling_metrics.__name__, 'INFO') as logs:
      self.poll(publisher, 4)
    self.assertIn('publishes its prior', '\n'.join(logs.output))
    self.assertEqual(publisher.value, 32)

  def test_window_median_follows_a_new_capacity(self):
    publisher = self.publisher(max_running_requests=256)
    for _ in range(24):
      publisher.batch_started(8)
    self.page = vllm_text(96, 96)
    self.poll(publisher, 60)
    self.assertEqual(publisher.value, 12)
    self.page = vllm_text(160, 32)
    self.poll(publisher, 29)
    self.assertEqual(publisher.value, 12)
    self.poll(publisher, 3)
    self.assertEqual(publisher.value, 20)

  def test_bad_samples_are_missing_and_change_nothing(self):
    publisher = self.publisher(max_running_requests=256)
    for _ in range(24):
      publisher.batch_started(8)
    self.page = vllm_text(128, 64)
    self.poll(publisher, 2)
    for page in (vllm_text('+Inf', 64),
                 vllm_text(1e308, 'NaN'),
                 vllm_text(-1, 64),
                 '<html>502</html>',
                 ConnectionRefusedError(111, 'refused')):
      with self.subTest(page=repr(page)[:40]):
        self.page = page
        with self.assertLogs(autoscaling_metrics.__name__, 'WARNING'):
          self.poll(publisher, 3)
        self.assertEqual(publisher.value, 16)
    self.page = vllm_text(160, 32)
    self.poll(publisher, 2)
    self.assertEqual(publisher.value, 18)

  def test_batches_in_flight_follow_started_and_finished(self):
    publisher = self.publisher(max_running_requests=256)
    for _ in range(40):
      publisher.batch_started(8)
    for _ in range(16):
      publisher.batch_finished(8)
    self.page = vllm_text(120, 0, preemptions=1)
    self.poll(publisher)
    self.page = vllm_text(120, 0, preemptions=2)
    self.poll(publisher)
    self.assertEqual(publisher.value, 24)

  def test_a_restarted_server_spans_no_interval(self):
    publisher = self.publisher(max_running_requests=256)
    for _ in range(24):
      publisher.batch_started(8)
    self.page = vllm_text(128, 64, preemptions=9)
    self.poll(publisher, 2)
    publisher.set_metrics_url('http://sim/other')
    self.page = vllm_text(0, 0, preemptions=0)
    self.poll(publisher, 3)
    self.page = vllm_text(0, 0, preemptions=1)
    self.poll(publisher)
    self.assertEqual(publisher.value, 16)


class _PageServer:
  """A real HTTP server on 127.0.0.1 that serves page() at /metrics, or waits
  or trickles as told."""
  def __init__(self, page, mode='ok'):
    self.page, self.mode, self.scrapes = page, mode, 0
    self.release = threading.Event()
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def do_GET(self):
        outer.scrapes += 1
        if outer.mode == 'hung':
          outer.release.wait(30)
          return
        body = outer.page().encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        if outer.mode == 'trickle':
          for byte in body:
            if outer.release.wait(0.05):
              return
            self.wfile.write(bytes([byte]))
            self.wfile.flush()
        else:
          self.wfile.write(body)

      def log_message(self, *args):
        pass

    self.server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self.server.daemon_threads = True
    # The publisher cuts slow connections on purpose.
    self.server.handle_error = lambda request, client_address: None
    self.url = 'http://127.0.0.1:%d/metrics' % self.server.server_address[1]
    self.thread = threading.Thread(
        target=self.server.serve_forever, args=(0.02, ), daemon=True)
    self.thread.start()

  def close(self):
    self.release.set()
    self.server.shutdown()
    self.server.server_close()


class ThreadTest(unittest.TestCase):
  """The polling thread against real HTTP servers on 127.0.0.1."""
  def serve(self, page, mode='ok'):
    server = _PageServer(page, mode)
    self.addCleanup(server.close)
    return server

  def start(self, url, poll_interval_secs=0.02, **kwargs):
    publisher = PrometheusNumLoadedModelsPublisher(
        url,
        uuid.uuid4().hex,
        VLLM_NAMES,
        AutoscalingConfig(
            poll_interval_secs=poll_interval_secs,
            max_running_requests=64,
            batch_size=1),
        **kwargs)
    self.addCleanup(publisher.stop)
    publisher.start()
    return publisher

  def wait_until(self, predicate, what):
    deadline = time.monotonic() + 60
    while not predicate():
      self.assertLess(time.monotonic(), deadline, what)
      time.sleep(0.005)

  def test_thread_measures_publishes_and_stops_with_zero(self):
    state = {'hits': 0}
    server = self.serve(lambda: vllm_text(32, 16, hits=state['hits']))
    namespace = f'test-{uuid.uuid4().hex}'
    publisher = self.start(
        server.url,
        counters={'vllm:prefix_cache_hits_total': 'hits'},
        counters_namespace=namespace)
    for _ in range(8):
      publisher.batch_started(6)
    self.wait_until(lambda: publisher.value == 5, 'a measurement')
    with self.assertRaisesRegex(RuntimeError, 'already started'):
      publisher.start()
    state['hits'] = 7
    publisher.stop()
    self.assertFalse(publisher.running)
    self.assertEqual(publisher.value, 0)
    data = num_loaded_models(publisher._tag)
    self.assertEqual(data.min, 0)
    self.assertGreaterEqual(data.max, 5)
    # The last scrape, when it stopped, published the last increase.
    self.assertEqual(process_wide_counter(namespace, 'hits'), 7)

  def test_stop_is_quick_against_slow_servers(self):
    big = vllm_text(1, 0) + '# padding\n' * ((8 << 20) // 10)
    for mode, page in (('hung', lambda: ''), ('trickle', lambda: big),
                       ('ok', lambda: big)):
      with self.subTest(mode):
        server = self.serve(page, mode)
        publisher = self.start(server.url, poll_interval_secs=5)
        self.wait_until(lambda s=server: s.scrapes, 'a scrape')
        time.sleep(0.1)
        started = time.monotonic()
        publisher.stop()
        self.assertLess(time.monotonic() - started, 2)
        self.assertFalse(publisher.running)

  def test_thread_stops_when_its_owner_is_collected(self):
    class Owner:
      pass

    owner = Owner()
    server = self.serve(lambda: vllm_text(1, 0))
    publisher = self.start(server.url, owner=owner)
    self.wait_until(lambda: publisher.value == 64, 'the prior')
    del owner
    gc.collect()
    self.wait_until(lambda: not publisher.running, 'the thread ends')
    self.assertEqual(publisher.value, 0)


class CountersTest(unittest.TestCase):
  def test_counters_follow_resets_and_restarts(self):
    namespace = f'test-{uuid.uuid4().hex}'
    state = {'page': vllm_text(0, 0, hits=64, queries=100)}
    publisher = PrometheusNumLoadedModelsPublisher(
        'http://a/metrics',
        'tag',
        VLLM_NAMES,
        counters={
            'vllm:prefix_cache_hits_total': 'hits',
            'vllm:prefix_cache_queries_total': 'queries',
        },
        counters_namespace=namespace,
        fetch=lambda url: state['page'])

    def counters():
      return (
          process_wide_counter(namespace, 'hits'),
          process_wide_counter(namespace, 'queries'))

    publisher._poll()
    self.assertEqual(counters(), (64, 100))
    state['page'] = vllm_text(0, 0, hits=96, queries=150)
    publisher._poll()
    self.assertEqual(counters(), (96, 150))
    # A reset counts from 0 again.
    state['page'] = vllm_text(0, 0, hits=10, queries=30)
    publisher._poll()
    self.assertEqual(counters(), (106, 180))
    # A new server counts from its start, even when it counted more.
    publisher.set_metrics_url('http://b/metrics')
    state['page'] = vllm_text(0, 0, hits=50, queries=300)
    publisher._poll()
    self.assertEqual(counters(), (156, 480))


class ValidationTest(unittest.TestCase):
  def test_config_rejects_bad_values(self):
    cases = [
        ('poll_interval_secs', '5', TypeError),
        ('poll_interval_secs', True, TypeError),
        ('poll_interval_secs', 0, ValueError),
        ('window_secs', float('inf'), ValueError),
        ('window_secs', 1, ValueError),
        ('hold_secs', 10, ValueError),
        ('target_utilization', 0, ValueError),
        ('target_utilization', 1.5, ValueError),
        ('max_running_requests', 2.5, TypeError),
        ('max_running_requests', 0, ValueError),
        ('batch_size', -1, ValueError),
        ('saturated_cache_usage', None, TypeError),
    ]
    for argument, value, error in cases:
      with self.subTest(argument=argument, value=value):
        with self.assertRaisesRegex(error, argument):
          AutoscalingConfig(**{argument: value})

  def test_config_defaults(self):
    config = AutoscalingConfig()
    self.assertEqual(
        (config.poll_interval_secs, config.window_secs, config.hold_secs),
        (5, 300, 3600))
    self.assertEqual(config.target_utilization, 1.0)
    self.assertIsNone(config.max_running_requests)

  def test_metric_names_are_checked(self):
    with self.assertRaisesRegex(TypeError, 'running'):
      ServerMetricNames(running=None, waiting='w')
    with self.assertRaisesRegex(ValueError, 'cache_usage'):
      ServerMetricNames(running='r', waiting='w', cache_usage='')

  def test_publisher_rejects_bad_arguments(self):
    url = 'http://127.0.0.1:1/metrics'
    with self.assertRaisesRegex(TypeError, 'metrics_url'):
      PrometheusNumLoadedModelsPublisher(None, 'tag', VLLM_NAMES)
    with self.assertRaisesRegex(ValueError, 'tag'):
      PrometheusNumLoadedModelsPublisher(url, '', VLLM_NAMES)
    with self.assertRaisesRegex(TypeError, 'metric_names'):
      PrometheusNumLoadedModelsPublisher(url, 'tag', {'running': 'r'})
    with self.assertRaisesRegex(TypeError, 'config'):
      PrometheusNumLoadedModelsPublisher(url, 'tag', VLLM_NAMES, {})
    with self.assertRaisesRegex(TypeError, 'counters'):
      PrometheusNumLoadedModelsPublisher(
          url, 'tag', VLLM_NAMES, counters=['a'], counters_namespace='n')
    with self.assertRaisesRegex(TypeError, 'counters_namespace'):
      PrometheusNumLoadedModelsPublisher(
          url, 'tag', VLLM_NAMES, counters=dict(a='b'))
    publisher = PrometheusNumLoadedModelsPublisher(url, 'tag', VLLM_NAMES)
    with self.assertRaisesRegex(TypeError, 'num_requests'):
      publisher.batch_started(2.0)
    with self.assertRaisesRegex(ValueError, 'num_requests'):
      publisher.batch_finished(-1)


if __name__ == '__main__':
  unittest.main()
