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

import gc
import http.server
import threading
import time
import unittest
import uuid

from apache_beam.metrics.execution import MetricsEnvironment
from apache_beam.metrics.metricbase import MetricName
from apache_beam.ml.inference import autoscaling_metrics
from apache_beam.ml.inference.autoscaling_metrics import AutoscalingConfig
from apache_beam.ml.inference.autoscaling_metrics import PrometheusNumLoadedModelsPublisher

try:
  import prometheus_client
except ImportError:
  prometheus_client = None

# Generous: the tests wait for what the publisher does, never for a time.
_DEADLINE_SECS = 120


def wait_until(predicate, what):
  deadline = time.monotonic() + _DEADLINE_SECS
  while not predicate():
    if time.monotonic() > deadline:
      raise AssertionError(f'Timed out waiting until {what}.')
    time.sleep(0.01)


class FakeVLLMMetricsServer:
  """A real HTTP server on 127.0.0.1 whose /metrics serves Prometheus text
  like vLLM's. Its request counters grow with time at the rates set with
  set_load, as a server under that load would count them."""
  def __init__(self, port=0):
    self._lock = threading.Condition()
    self._time = time.monotonic()
    self._rate = 0.0
    self._abort_rate = 0.0
    self._running = 0
    self._counts = {'stop': 0.0, 'length': 0.0, 'abort': 0.0}
    self._hits = 0
    self._queries = 0
    self.mode = 'vllm'
    self.scrapes = 0
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def do_GET(self):
        body = outer._text().encode()
        self.send_response(200)
        self.send_header('Content-Type', 'text/plain; version=0.0.4')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

      def log_message(self, *args):
        pass

    self._server = http.server.ThreadingHTTPServer(('127.0.0.1', port), Handler)
    self.port = self._server.server_address[1]
    self.url = f'http://127.0.0.1:{self.port}/metrics'
    self._thread = threading.Thread(
        target=self._server.serve_forever, daemon=True)
    self._thread.start()

  def close(self):
    self._server.shutdown()
    self._server.server_close()

  def _advance(self):
    now = time.monotonic()
    elapsed, self._time = now - self._time, now
    self._counts['stop'] += self._rate * elapsed / 2
    self._counts['length'] += self._rate * elapsed / 2
    self._counts['abort'] += self._abort_rate * elapsed

  def set_load(self, running, rate, abort_rate=0.0):
    """running requests, finishing at rate (stop and length) a second."""
    with self._lock:
      self._advance()
      self._running, self._rate, self._abort_rate = running, rate, abort_rate

  def add_cache_tokens(self, hits, queries):
    with self._lock:
      self._hits += hits
      self._queries += queries

  def reset(self):
    """Counts from 0 again, as a restarted server does."""
    with self._lock:
      self._advance()
      self._counts = dict.fromkeys(self._counts, 0.0)
      self._hits = self._queries = 0

  def wait_for_scrapes(self, count):
    """Waits until the server has answered count more scrapes."""
    with self._lock:
      target = self.scrapes + count
      if not self._lock.wait_for(lambda: self.scrapes >= target,
                                 _DEADLINE_SECS):
        raise AssertionError(f'Timed out waiting for {count} scrapes.')

  def _text(self):
    with self._lock:
      self._advance()
      self.scrapes += 1
      self._lock.notify_all()
      if self.mode == 'garbage':
        return '<html><body>Service Unavailable</body></html>\n'
      if self.mode == 'other':
        return '# TYPE process_cpu_seconds_total counter\n' \
               'process_cpu_seconds_total 12.5\n'
      labels = 'engine="0",model_name="tiny"'
      lines = [
          '# HELP vllm:num_requests_running Requests in model execution.',
          '# TYPE vllm:num_requests_running gauge',
          f'vllm:num_requests_running{{{labels}}} {self._running}',
          '# TYPE vllm:num_requests_waiting gauge',
          f'vllm:num_requests_waiting{{{labels}}} 0.0',
          '# HELP vllm:request_success_total Finished requests.',
          '# TYPE vllm:request_success_total counter',
      ]
      for reason, count in self._counts.items():
        lines.append(
            'vllm:request_success_total{%s,finished_reason="%s"} %r' %
            (labels, reason, count))
      lines += [
          '# TYPE vllm:prefix_cache_hits_total counter',
          f'vllm:prefix_cache_hits_total{{{labels}}} {float(self._hits)}',
          '# TYPE vllm:prefix_cache_queries_total counter',
          f'vllm:prefix_cache_queries_total{{{labels}}} '
          f'{float(self._queries)}',
          '# TYPE vllm:e2e_request_latency_seconds histogram',
          f'vllm:e2e_request_latency_seconds_bucket{{{labels},le="1.0"}} 3.0',
          f'vllm:e2e_request_latency_seconds_bucket{{{labels},le="+Inf"}} 4.0',
          f'vllm:e2e_request_latency_seconds_count{{{labels}}} 4.0',
          f'vllm:e2e_request_latency_seconds_sum{{{labels}}} 2.5',
      ]
      return '\n'.join(lines) + '\n'


def num_loaded_models(tag):
  return MetricsEnvironment.process_wide_container().get_distribution(
      MetricName('BeamML_ModelManager',
                 f'num_loaded_models_{tag}')).get_cumulative()


def process_wide_counter(namespace, name):
  return MetricsEnvironment.process_wide_container().get_counter(
      MetricName(namespace, name)).get_cumulative()


class PublisherTestBase(unittest.TestCase):
  def setUp(self):
    self.server = FakeVLLMMetricsServer()
    self.addCleanup(self.server.close)
    self.tag = uuid.uuid4().hex

  def start(self, url=None, **kwargs):
    config = AutoscalingConfig(
        poll_interval_secs=kwargs.pop('poll_interval_secs', 0.05),
        window_secs=kwargs.pop('window_secs', 60),
        **kwargs.pop('config', {}))
    publisher = PrometheusNumLoadedModelsPublisher(
        url or self.server.url, self.tag, config, **kwargs)
    self.addCleanup(publisher.stop)
    publisher.start()
    return publisher

  def settle(self, scrapes=6):
    """Lets the publisher see the current load for some polls."""
    self.server.wait_for_scrapes(scrapes)


class EstimateTest(PublisherTestBase):
  def test_busy_server_reports_the_requests_it_serves_at_once(self):
    self.server.set_load(running=12, rate=30)
    publisher = self.start()
    self.settle()
    self.assertEqual(publisher.value, 12)
    data = num_loaded_models(self.tag)
    self.assertEqual(data.max, 12)
    self.assertGreater(data.count, 1)

  def test_estimate_counts_batches_of_the_recorded_size(self):
    self.server.set_load(running=12, rate=30)
    publisher = self.start()
    for _ in range(5):
      publisher.record_batch(4)
    self.settle()
    self.assertEqual(publisher.value, 3)

  def test_idle_server_reports_one(self):
    self.server.set_load(running=0, rate=0)
    publisher = self.start()
    self.settle()
    self.assertEqual(publisher.value, 1)
    self.assertEqual(num_loaded_models(self.tag).max, 1)

  def test_running_requests_that_finish_nothing_are_not_busy(self):
    self.server.set_load(running=40, rate=0)
    publisher = self.start()
    self.settle()
    self.assertEqual(publisher.value, 1)

  def test_idle_periods_do_not_lower_the_estimate(self):
    self.server.set_load(running=12, rate=30)
    publisher = self.start(window_secs=600)
    self.settle()
    self.assertEqual(publisher.value, 12)
    self.server.set_load(running=0, rate=0)
    self.settle(scrapes=10)
    self.assertEqual(publisher.value, 12)
    self.server.set_load(running=1, rate=0.5)
    self.settle(scrapes=10)
    self.assertEqual(publisher.value, 12)

  def test_estimate_forgets_a_burst_after_the_window(self):
    self.server.set_load(running=12, rate=30)
    publisher = self.start(poll_interval_secs=0.05, window_secs=0.5)
    wait_until(lambda: publisher.value == 12, 'the burst is seen')
    self.server.set_load(running=0, rate=0)
    wait_until(lambda: publisher.value == 1, 'the burst is forgotten')
    self.assertEqual(num_loaded_models(self.tag).max, 12)

  def test_queueing_more_requests_without_more_throughput_is_not_capacity(self):
    # At its best latency the server finishes 4 running requests at 20/s,
    # 0.2 s each. Given 64 it finishes 40/s, 1.6 s each: the running gauge
    # says 64, but 40/s at 0.2 s each takes only about 8 at once.
    self.server.set_load(running=4, rate=20)
    publisher = self.start(poll_interval_secs=0.2)
    self.settle()
    self.assertEqual(publisher.value, 4)
    self.server.set_load(running=64, rate=40)
    self.settle()
    self.assertGreaterEqual(publisher.value, 4)
    self.assertLessEqual(publisher.value, 16)

  def test_a_percentile_ignores_a_few_odd_intervals(self):
    # A few intervals finish many requests while the running gauge, read
    # at both ends, shows one: the max and the min latency follow them, a
    # lower percentile does not.
    self.server.set_load(running=8, rate=10)
    lower = self.start(poll_interval_secs=0.05, config={'percentile': 80})
    peak = PrometheusNumLoadedModelsPublisher(
        self.server.url,
        uuid.uuid4().hex,
        AutoscalingConfig(
            poll_interval_secs=0.05, window_secs=60, percentile=100))
    self.addCleanup(peak.stop)
    peak.start()
    self.settle(scrapes=40)
    self.assertEqual((lower.value, peak.value), (8, 8))
    self.server.set_load(running=1, rate=100)
    self.settle(scrapes=8)
    self.server.set_load(running=8, rate=10)
    self.settle(scrapes=40)
    self.assertEqual(lower.value, 8)
    self.assertLessEqual(peak.value, 2)

  def test_aborted_requests_are_not_completions(self):
    self.server.set_load(running=8, rate=0, abort_rate=200)
    publisher = self.start()
    self.settle()
    self.assertEqual(publisher.value, 1)
    self.server.set_load(running=8, rate=20, abort_rate=200)
    wait_until(lambda: publisher.value == 8, 'completions are seen')

  def test_counter_reset_does_not_break_the_estimate(self):
    self.server.set_load(running=12, rate=30)
    publisher = self.start(window_secs=0.5)
    wait_until(lambda: publisher.value == 12, 'the load is seen')
    with self.assertLogs(autoscaling_metrics.__name__, 'INFO') as logs:
      self.server.reset()
      self.settle(scrapes=3)
    self.assertIn('was reset', '\n'.join(logs.output))
    # Long after the window, the estimate still comes from new intervals.
    self.settle(scrapes=20)
    self.assertEqual(publisher.value, 12)


class RobustnessTest(PublisherTestBase):
  def test_unreachable_server_then_reachable(self):
    self.server.close()
    port = self.server.port
    with self.assertLogs(autoscaling_metrics.__name__, 'WARNING') as logs:
      publisher = self.start()
      wait_until(lambda: publisher.value == 1, 'a value is published')
    self.assertIn(f'cannot read {self.server.url}', '\n'.join(logs.output))
    self.server = FakeVLLMMetricsServer(port=port)
    self.addCleanup(self.server.close)
    self.server.set_load(running=6, rate=30)
    wait_until(lambda: publisher.value == 6, 'the server is read')
    self.assertTrue(publisher.running)

  def test_garbage_text_is_logged_and_polling_goes_on(self):
    self.server.mode = 'garbage'
    self.server.set_load(running=6, rate=30)
    with self.assertLogs(autoscaling_metrics.__name__, 'WARNING') as logs:
      publisher = self.start()
      self.settle()
    self.assertIn('ValueError', '\n'.join(logs.output))
    self.assertEqual(publisher.value, 1)
    self.server.mode = 'vllm'
    wait_until(lambda: publisher.value == 6, 'the text parses')

  def test_missing_metrics_are_logged_and_polling_goes_on(self):
    self.server.mode = 'other'
    self.server.set_load(running=6, rate=30)
    with self.assertLogs(autoscaling_metrics.__name__, 'WARNING') as logs:
      publisher = self.start()
      self.settle()
    self.assertIn(
        'has no vllm:request_success_total or vllm:num_requests_running',
        '\n'.join(logs.output))
    self.assertEqual(publisher.value, 1)
    self.server.mode = 'vllm'
    wait_until(lambda: publisher.value == 6, 'the metrics appear')

  def test_a_problem_is_logged_once_while_it_lasts(self):
    self.server.mode = 'garbage'
    with self.assertLogs(autoscaling_metrics.__name__, 'WARNING') as logs:
      # A scrape times out after a poll interval: a long one keeps a loaded
      # machine from adding timeouts to the garbage.
      self.start(poll_interval_secs=0.5)
      self.settle(scrapes=4)
    self.assertEqual(len(logs.output), 1)


class LifecycleTest(PublisherTestBase):
  def test_stop_publishes_zero_and_joins(self):
    self.server.set_load(running=12, rate=30)
    publisher = self.start()
    self.settle()
    publisher.stop()
    self.assertFalse(publisher.running)
    self.assertEqual(publisher.value, 0)
    data = num_loaded_models(self.tag)
    self.assertEqual((data.min, data.max), (0, 12))

  def test_stop_before_start_and_twice(self):
    publisher = PrometheusNumLoadedModelsPublisher(self.server.url, self.tag)
    publisher.stop()
    publisher.stop()
    self.assertIsNone(publisher.value)
    self.assertFalse(publisher.running)

  def test_start_twice_raises(self):
    publisher = self.start()
    with self.assertRaisesRegex(RuntimeError, 'already started'):
      publisher.start()

  def test_thread_stops_when_its_owner_is_collected(self):
    class Owner:
      pass

    owner = Owner()
    self.server.set_load(running=12, rate=30)
    publisher = self.start(owner=owner)
    self.settle()
    self.assertTrue(publisher.running)
    del owner
    gc.collect()
    wait_until(lambda: not publisher.running, 'the thread ends')
    self.assertEqual(publisher.value, 0)


class CountersTest(PublisherTestBase):
  def start_with_counters(self, **kwargs):
    self.namespace = f'test-{uuid.uuid4().hex}'
    return self.start(
        counters={
            'vllm:prefix_cache_hits_total': 'hits',
            'vllm:prefix_cache_queries_total': 'queries',
        },
        counters_namespace=self.namespace,
        **kwargs)

  def counter(self, name):
    return process_wide_counter(self.namespace, name)

  def test_counters_follow_the_server(self):
    self.server.add_cache_tokens(hits=64, queries=100)
    self.start_with_counters()
    wait_until(lambda: self.counter('hits') == 64, 'hits are published')
    self.assertEqual(self.counter('queries'), 100)
    self.server.add_cache_tokens(hits=32, queries=50)
    wait_until(lambda: self.counter('hits') == 96, 'more hits are published')
    self.assertEqual(self.counter('queries'), 150)

  def test_counter_reset_adds_the_new_count(self):
    self.server.add_cache_tokens(hits=64, queries=100)
    self.start_with_counters()
    wait_until(lambda: self.counter('queries') == 100, 'queries are seen')
    self.server.reset()
    self.server.add_cache_tokens(hits=10, queries=30)
    wait_until(lambda: self.counter('queries') == 130, 'the reset is seen')
    self.assertEqual(self.counter('hits'), 74)

  def test_stop_publishes_the_last_increase(self):
    publisher = self.start_with_counters(
        poll_interval_secs=600, window_secs=600)
    # The first scrape may come before settle() could count it, and the next
    # one is ten minutes away: wait for the first one itself.
    wait_until(lambda: self.server.scrapes >= 1, 'the first scrape')
    self.server.add_cache_tokens(hits=7, queries=9)
    publisher.stop()
    self.assertEqual((self.counter('hits'), self.counter('queries')), (7, 9))


class ParserTest(unittest.TestCase):
  TEXT = '\n'.join([
      '# HELP vllm:request_success_total Finished requests.',
      '# TYPE vllm:request_success_total counter',
      'vllm:request_success_total{finished_reason="stop",model_name="a"} 3.0',
      'vllm:request_success_total{model_name="a",finished_reason="abort"} 1',
      '# TYPE vllm:num_requests_running gauge',
      'vllm:num_requests_running{model_name="a \\"b\\" \\\\ c"} 2',
      'vllm:kv_cache_usage_perc 0.5',
      '',
  ])
  EXPECTED = [
      (
          'vllm:request_success_total',
          dict(finished_reason='stop', model_name='a'),
          3.0),
      (
          'vllm:request_success_total',
          dict(model_name='a', finished_reason='abort'),
          1.0),
      ('vllm:num_requests_running', dict(model_name='a "b" \\ c'), 2.0),
      ('vllm:kv_cache_usage_perc', {}, 0.5),
  ]
  GARBAGE = [
      '<html><body>502 Bad Gateway</body></html>',
      'vllm:num_requests_running{model_name="a} 2',
      'vllm:num_requests_running twelve',
  ]

  def test_fallback_parser(self):
    self.assertEqual(
        autoscaling_metrics.parse_samples_fallback(self.TEXT), self.EXPECTED)

  def test_fallback_parser_rejects_garbage(self):
    for text in self.GARBAGE:
      with self.subTest(text):
        with self.assertRaises(ValueError):
          autoscaling_metrics.parse_samples_fallback(text)

  @unittest.skipIf(prometheus_client is None, 'prometheus_client missing')
  def test_prometheus_client_parser_is_used_when_importable(self):
    self.assertIs(
        autoscaling_metrics.parse_samples,
        autoscaling_metrics.parse_samples_prometheus_client)
    self.assertEqual(
        autoscaling_metrics.parse_samples_prometheus_client(self.TEXT),
        self.EXPECTED)
    for text in self.GARBAGE:
      with self.subTest(text):
        with self.assertRaises(ValueError):
          autoscaling_metrics.parse_samples_prometheus_client(text)


class ValidationTest(unittest.TestCase):
  def test_config_rejects_bad_values(self):
    cases = [
        ('poll_interval_secs', '5', TypeError),
        ('poll_interval_secs', True, TypeError),
        ('poll_interval_secs', 0, ValueError),
        ('poll_interval_secs', -1, ValueError),
        ('window_secs', float('inf'), ValueError),
        ('window_secs', 1, ValueError),
        ('percentile', None, TypeError),
        ('percentile', 0, ValueError),
        ('percentile', 101, ValueError),
        ('completions_metric', 3, TypeError),
        ('running_metric', '', ValueError),
        ('completion_reasons', 'stop', TypeError),
        ('completion_reasons', (), ValueError),
        ('completion_reasons', ['', 'x'], ValueError),
    ]
    for argument, value, error in cases:
      with self.subTest(argument=argument, value=value):
        with self.assertRaisesRegex(error, argument):
          AutoscalingConfig(**{argument: value})

  def test_config_defaults(self):
    config = AutoscalingConfig()
    self.assertEqual(config.poll_interval_secs, 5)
    self.assertEqual(config.percentile, 90)
    self.assertEqual(config.completions_metric, 'vllm:request_success_total')
    self.assertEqual(config.completion_reasons, ('stop', 'length'))
    self.assertEqual(config.running_metric, 'vllm:num_requests_running')
    self.assertIn('poll_interval_secs=5', repr(config))

  def test_publisher_rejects_bad_arguments(self):
    url = 'http://127.0.0.1:1/metrics'
    with self.assertRaisesRegex(TypeError, 'metrics_url'):
      PrometheusNumLoadedModelsPublisher(None, 'tag')
    with self.assertRaisesRegex(ValueError, 'tag'):
      PrometheusNumLoadedModelsPublisher(url, '')
    with self.assertRaisesRegex(TypeError, 'config'):
      PrometheusNumLoadedModelsPublisher(url, 'tag', dict(poll_interval_secs=1))
    with self.assertRaisesRegex(TypeError, 'counters'):
      PrometheusNumLoadedModelsPublisher(
          url, 'tag', counters=['a'], counters_namespace='n')
    with self.assertRaisesRegex(TypeError, 'counters_namespace'):
      PrometheusNumLoadedModelsPublisher(url, 'tag', counters=dict(a='b'))

  def test_record_batch_rejects_bad_sizes(self):
    publisher = PrometheusNumLoadedModelsPublisher(
        'http://127.0.0.1:1/metrics', 'tag')
    with self.assertRaisesRegex(TypeError, 'num_requests'):
      publisher.record_batch(2.0)
    with self.assertRaisesRegex(ValueError, 'num_requests'):
      publisher.record_batch(-1)


if __name__ == '__main__':
  unittest.main()
