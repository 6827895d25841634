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

"""A capacity signal for autoscaling, read from an inference server.

RunInference's model manager publishes ``num_loaded_models_<tag>``, a
process-wide Beam distribution in the namespace ``BeamML_ModelManager``, and
runners that autoscale on it (Dataflow's GPU autoscaling) read it as the
number of batches a worker can serve at once. A worker that sends its batches
to an inference server, such as vLLM, always has one model loaded, but the
server serves many batches at once. ``PrometheusNumLoadedModelsPublisher``
estimates that number from the server's own Prometheus metrics and publishes
it under the same name.
"""

import collections
import logging
import math
import re
import sys
import threading
import time
import urllib.request
import weakref
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import Optional

from apache_beam.metrics.metric import Metrics
from apache_beam.metrics.metricbase import MetricName

try:
  from prometheus_client.parser import text_string_to_metric_families
except ImportError:
  text_string_to_metric_families = None

__all__ = [
    'AutoscalingConfig',
    'PrometheusNumLoadedModelsPublisher',
]

_LOGGER = logging.getLogger(__name__)

# The distribution RunInference's model manager publishes; see
# apache_beam.ml.inference.model_manager.
NUM_LOADED_MODELS_NAMESPACE = 'BeamML_ModelManager'
NUM_LOADED_MODELS_PREFIX = 'num_loaded_models_'

# Upper bound on one scrape, so that stop() never waits long.
_MAX_SCRAPE_TIMEOUT_SECS = 5.0


def _check_positive_number(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise TypeError(f'{name} must be a number, got {value!r}.')
  if not math.isfinite(value) or value <= 0:
    raise ValueError(f'{name} must be positive and finite, got {value!r}.')


def _check_non_empty_str(name: str, value: Any) -> None:
  if not isinstance(value, str):
    raise TypeError(f'{name} must be a str, got {value!r}.')
  if not value:
    raise ValueError(f'{name} must not be empty.')


class AutoscalingConfig:
  """How PrometheusNumLoadedModelsPublisher polls and aggregates.

  Args:
    poll_interval_secs: seconds between two scrapes of the server's metrics.
    window_secs: the estimate uses the busy periods of the last window_secs
      only, so it follows the load down as well as up; at least
      poll_interval_secs.
    percentile: in (0, 100]. The estimate takes the window's throughput at
      this percentile and its latency at the same rank from the other end:
      100 takes the max throughput and the min latency, the default 90
      leaves out the most extreme tenth of the intervals at each end (such
      as an interval whose running gauge was read between two batches).
    completions_metric: the counter of finished requests, as scraped.
    completion_reasons: the values of its ``finished_reason`` label that count
      as completions; other reasons (an abort) do not.
    running_metric: the gauge of requests the server is running.

  The metric names default to vLLM's.
  """
  def __init__(
      self,
      poll_interval_secs: float = 5,
      window_secs: float = 300,
      percentile: float = 90,
      completions_metric: str = 'vllm:request_success_total',
      completion_reasons: Sequence[str] = ('stop', 'length'),
      running_metric: str = 'vllm:num_requests_running'):
    _check_positive_number('poll_interval_secs', poll_interval_secs)
    _check_positive_number('window_secs', window_secs)
    if window_secs < poll_interval_secs:
      raise ValueError(
          f'window_secs ({window_secs!r}) must be at least '
          f'poll_interval_secs ({poll_interval_secs!r}).')
    _check_positive_number('percentile', percentile)
    if percentile > 100:
      raise ValueError(f'percentile must be at most 100, got {percentile!r}.')
    _check_non_empty_str('completions_metric', completions_metric)
    _check_non_empty_str('running_metric', running_metric)
    if isinstance(completion_reasons,
                  str) or not isinstance(completion_reasons, Sequence):
      raise TypeError(
          'completion_reasons must be a sequence of str, got '
          f'{completion_reasons!r}.')
    if not completion_reasons or not all(isinstance(r, str) and r
                                         for r in completion_reasons):
      raise ValueError(
          'completion_reasons must hold one or more non-empty str, got '
          f'{completion_reasons!r}.')
    self.poll_interval_secs = poll_interval_secs
    self.window_secs = window_secs
    self.percentile = percentile
    self.completions_metric = completions_metric
    self.completion_reasons = tuple(completion_reasons)
    self.running_metric = running_metric

  def __repr__(self):
    return (
        f'AutoscalingConfig(poll_interval_secs={self.poll_interval_secs!r}, '
        f'window_secs={self.window_secs!r}, '
        f'percentile={self.percentile!r}, '
        f'completions_metric={self.completions_metric!r}, '
        f'completion_reasons={self.completion_reasons!r}, '
        f'running_metric={self.running_metric!r})')


# A sample line of the Prometheus text format, and one label in its braces.
_SAMPLE_LINE = re.compile(
    r'([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$')
_LABEL = re.compile(r'\s*([a-zA-Z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_UNESCAPE = {'\\\\': '\\', '\\"': '"', '\\n': '\n'}


def _parse_labels(text: str) -> dict[str, str]:
  labels = {}
  pos = 0
  while pos < len(text.rstrip()):
    match = _LABEL.match(text, pos)
    if not match:
      raise ValueError(f'Cannot parse the labels {{{text}}}.')
    labels[match.group(1)] = re.sub(
        r'\\.', lambda m: _UNESCAPE.get(m.group(0), m.group(0)), match.group(2))
    pos = match.end()
  return labels


def parse_samples_fallback(
    text: str) -> list[tuple[str, dict[str, str], float]]:
  """Parses Prometheus text into (sample name, labels, value) triples; used
  only when prometheus_client is not importable. Raises ValueError on a line
  that is not a comment or a sample."""
  samples = []
  for number, line in enumerate(text.splitlines(), 1):
    if not line.strip() or line.lstrip().startswith('#'):
      continue
    match = _SAMPLE_LINE.match(line.strip())
    if not match:
      raise ValueError(f'Line {number} is not a sample: {line[:80]!r}.')
    name, labels, value = match.groups()
    try:
      samples.append((name, _parse_labels(labels or ''), float(value)))
    except ValueError as e:
      raise ValueError(f'Line {number}: {e} {line[:80]!r}') from e
  return samples


def parse_samples_prometheus_client(
    text: str) -> list[tuple[str, dict[str, str], float]]:
  """Parses Prometheus text into (sample name, labels, value) triples with
  prometheus_client's parser. Raises ValueError on malformed text."""
  return [(sample.name, dict(sample.labels), float(sample.value))
          for family in text_string_to_metric_families(text)
          for sample in family.samples]


parse_samples = (
    parse_samples_prometheus_client
    if text_string_to_metric_families is not None else parse_samples_fallback)

_Interval = collections.namedtuple(
    '_Interval', ['end', 'throughput', 'latency'])


class PrometheusNumLoadedModelsPublisher:
  """Publishes how many batches an inference server can serve at once.

  A background thread scrapes the server's Prometheus metrics at
  ``metrics_url`` every ``config.poll_interval_secs`` and publishes its
  estimate to the process-wide distribution ``num_loaded_models_<tag>`` in
  the namespace ``BeamML_ModelManager``, where RunInference's model manager
  publishes how many models a worker has loaded.

  The estimate applies Little's law (requests in service = throughput x time
  in service) to the server's counters. Between two scrapes, an interval of
  ``dt`` seconds, the server finished ``done`` requests (the completions
  counter's increase over the series whose ``finished_reason`` is a
  completion reason) and ran ``running`` requests on average (the mean of
  the running gauge at both scrapes). An interval counts only when the server
  was busy: requests running at both scrapes and some finished in between.
  Its throughput is ``X = done / dt`` and, by Little's law, a request spent
  ``S = running / X`` seconds in service. Over the n busy intervals of the
  last ``config.window_secs``, with ``k = ceil(n * config.percentile / 100)``::

    concurrency = (k-th lowest X) * (k-th highest S)
    estimate = max(1, round(concurrency / mean batch size))

  ``concurrency`` is how many requests the server serves at once when it
  delivers its peak throughput at its best latency: beyond it, more requests
  only wait longer. It always lies between the lowest and the highest
  running count of the window's busy intervals. While the running count
  holds steady it equals that count; when more running requests bring more
  latency but no more throughput, it stays below it, so a server that only
  queues does not look bigger. The mean batch size is that of the batches
  ``record_batch`` noted in the same window; without any, the estimate
  counts requests.

  Idle intervals leave the window as it is, so idle periods do not drag the
  estimate down, and old intervals drop out of the window, so one burst does
  not hold it up; with no busy interval in the window, the estimate is 1.
  A counter that goes down was reset (the server restarted): that interval
  is skipped. A scrape that fails (unreachable server, an HTTP error, text
  that does not parse, missing metrics) is logged and the thread goes on
  polling; nothing it raises leaves the thread. ``stop()`` publishes 0 and
  joins the thread; so does the collection of ``owner``, when given.

  Args:
    metrics_url: the server's Prometheus text endpoint, e.g.
      ``http://localhost:8000/metrics``.
    tag: the model tag RunInference knows the model by (see
      ModelHandler.set_model_identifier).
    config: an AutoscalingConfig; the defaults when None.
    counters: optional. Server counters to republish, a mapping from the
      scraped sample name (e.g. ``vllm:prefix_cache_hits_total``) to a Beam
      counter name. Each scrape adds their increases to process-wide Beam
      counters in ``counters_namespace``; the first scrape adds their values
      since the server started, a reset adds the new value.
    counters_namespace: the namespace of those counters; required with them.
    owner: optional. An object whose collection stops the publisher. The
      publisher holds only a weak reference to it.
  """
  def __init__(
      self,
      metrics_url: str,
      tag: str,
      config: Optional[AutoscalingConfig] = None,
      *,
      counters: Optional[Mapping[str, str]] = None,
      counters_namespace: Optional[str] = None,
      owner: Optional[object] = None):
    _check_non_empty_str('metrics_url', metrics_url)
    _check_non_empty_str('tag', tag)
    if config is None:
      config = AutoscalingConfig()
    if not isinstance(config, AutoscalingConfig):
      raise TypeError(f'config must be an AutoscalingConfig, got {config!r}.')
    counters = counters or {}
    if not isinstance(counters, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in counters.items()):
      raise TypeError(
          f'counters must be a mapping from str to str, got {counters!r}.')
    if counters:
      _check_non_empty_str('counters_namespace', counters_namespace)
    self._url = metrics_url
    self._tag = tag
    self._config = config
    self._timeout = min(config.poll_interval_secs, _MAX_SCRAPE_TIMEOUT_SECS)
    self._distribution = Metrics.distribution(
        NUM_LOADED_MODELS_NAMESPACE,
        NUM_LOADED_MODELS_PREFIX + tag,
        process_wide=True)
    self._counters = {
        source: Metrics.DelegatingCounter(
            MetricName(counters_namespace, name), process_wide=True)
        for source, name in counters.items()
    }
    self._counter_values: dict[str, float] = {}
    # (time, completed, running) of the last scrape that had both metrics.
    self._last: Optional[tuple[float, float, float]] = None
    self._intervals: collections.deque = collections.deque()
    # (time, batches, requests) per poll, and the counts since the last poll.
    self._batches: collections.deque = collections.deque()
    self._lock = threading.Lock()
    self._pending_batches = 0
    self._pending_requests = 0
    self._problem: Optional[str] = None
    self._value: Optional[int] = None
    self._stopping = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self._finalizer = (
        weakref.finalize(owner, self._stopping.set)
        if owner is not None else None)

  @property
  def value(self) -> Optional[int]:
    """The value published last, or None before the first."""
    return self._value

  @property
  def running(self) -> bool:
    """Whether the polling thread runs."""
    return self._thread is not None and self._thread.is_alive()

  def record_batch(self, num_requests: int) -> None:
    """Notes that a batch of num_requests requests was sent to the server."""
    if isinstance(num_requests, bool) or not isinstance(num_requests, int):
      raise TypeError(f'num_requests must be an int, got {num_requests!r}.')
    if num_requests < 0:
      raise ValueError(
          f'num_requests must not be negative, got {num_requests!r}.')
    with self._lock:
      self._pending_batches += 1
      self._pending_requests += num_requests

  def start(self) -> None:
    """Starts the polling thread; a publisher starts once."""
    if self._thread is not None:
      raise RuntimeError('The publisher was already started.')
    self._thread = threading.Thread(
        target=self._run,
        name=f'PrometheusNumLoadedModelsPublisher-{self._tag}',
        daemon=True)
    self._thread.start()

  def stop(self) -> None:
    """Stops the polling thread: it scrapes a last time for the counters,
    publishes 0 and ends. Joins it, unless called from the thread itself."""
    self._stopping.set()
    if self._finalizer is not None:
      self._finalizer.detach()
    thread = self._thread
    if (thread is not None and thread is not threading.current_thread() and
        not sys.is_finalizing()):
      thread.join(timeout=4 * self._timeout + 1)

  def _run(self) -> None:
    while True:
      try:
        self._poll()
      except Exception:  # pylint: disable=broad-except
        _LOGGER.exception('Publisher %s failed to poll.', self._tag)
      if self._stopping.wait(self._config.poll_interval_secs):
        break
    try:
      # Counter increases since the last poll, e.g. of the last batches.
      self._scrape()
    except Exception:  # pylint: disable=broad-except
      _LOGGER.exception('Publisher %s failed to poll.', self._tag)
    self._publish(0)

  def _poll(self) -> None:
    now = self._scrape()
    if now is None:
      now = time.monotonic()
    cutoff = now - self._config.window_secs
    while self._intervals and self._intervals[0].end < cutoff:
      self._intervals.popleft()
    with self._lock:
      self._batches.append((now, self._pending_batches, self._pending_requests))
      self._pending_batches = self._pending_requests = 0
    while self._batches and self._batches[0][0] < cutoff:
      self._batches.popleft()
    self._publish(self._estimate())

  def _scrape(self) -> Optional[float]:
    """Fetches and reads the server's metrics; returns the scrape's time,
    or None when it failed."""
    try:
      with urllib.request.urlopen(self._url, timeout=self._timeout) as resp:
        text = resp.read().decode('utf-8', errors='replace')
      now = time.monotonic()
      samples = parse_samples(text)
    except Exception as e:  # pylint: disable=broad-except
      self._report(f'cannot read {self._url}: {e!r}')
      return None
    self._read_counters(samples)
    missing = self._observe(now, samples)
    self._report(
        f'{self._url} has no {" or ".join(missing)}' if missing else None)
    return now

  def _read_counters(self, samples) -> None:
    for source, counter in self._counters.items():
      values = [value for name, _, value in samples if name == source]
      if not values:
        continue
      current = sum(values)
      previous = self._counter_values.get(source, 0.0)
      # A counter that went down was reset and counts from 0 again.
      increase = current - previous if current >= previous else current
      self._counter_values[source] = current
      if increase > 0:
        counter.inc(int(round(increase)))

  def _observe(self, now: float, samples) -> list[str]:
    """Adds the interval since the last scrape to the window when the server
    was busy in it; returns the names of the metrics that are missing."""
    config = self._config
    completed = [
        value for name, labels, value in samples
        if name == config.completions_metric and
        labels.get('finished_reason') in config.completion_reasons
    ]
    running = [
        value for name, _, value in samples if name == config.running_metric
    ]
    missing = [
        name for name, values in ((config.completions_metric, completed),
                                  (config.running_metric, running))
        if not values
    ]
    last, self._last = self._last, None
    if missing:
      return missing
    current = (now, sum(completed), sum(running))
    self._last = current
    if last is None or current[0] <= last[0]:
      return []
    dt, done = current[0] - last[0], current[1] - last[1]
    if done < 0:
      _LOGGER.info(
          '%s was reset; the interval before %s is skipped.',
          config.completions_metric,
          self._url)
    elif done > 0 and last[2] > 0 and current[2] > 0:
      throughput = done / dt
      latency = (last[2] + current[2]) / 2 / throughput
      self._intervals.append(_Interval(now, throughput, latency))
    return []

  def _estimate(self) -> int:
    if not self._intervals:
      return 1
    count = len(self._intervals)
    rank = max(1, math.ceil(self._config.percentile / 100 * count))
    throughput = sorted(i.throughput for i in self._intervals)[rank - 1]
    latency = sorted(i.latency for i in self._intervals)[count - rank]
    batches = sum(b for _, b, _ in self._batches)
    requests = sum(r for _, _, r in self._batches)
    batch_size = requests / batches if batches and requests else 1.0
    return max(1, int(throughput * latency / batch_size + 0.5))

  def _publish(self, value: int) -> None:
    self._value = value
    self._distribution.update(value)

  def _report(self, problem: Optional[str]) -> None:
    """Logs a problem with the scrapes when it starts or changes, and when
    the scrapes recover, not at every poll."""
    if problem == self._problem:
      return
    if problem is None:
      _LOGGER.info('Publisher %s reads %s again.', self._tag, self._url)
    else:
      _LOGGER.warning('Publisher %s: %s; it keeps polling.', self._tag, problem)
    self._problem = problem
