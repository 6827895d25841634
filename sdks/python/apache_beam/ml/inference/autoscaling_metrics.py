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
runners that autoscale on it (Dataflow's GPU autoscaling) read it as a
worker's capacity: roughly, desired workers = work keys / reported value. A
worker that sends its batches to an inference server, such as vLLM, always
has one model loaded, but the server serves many batches at once.
``PrometheusNumLoadedModelsPublisher`` publishes, under the same name, how
many batches the server can serve at once, measured from the server's own
Prometheus metrics while it is saturated.

This module imports without torch, so that code which only needs the name
of the distribution (``NUM_LOADED_MODELS_NAMESPACE``,
``num_loaded_models_name``) need not import the model manager.
"""

import collections
import dataclasses
import http.client
import logging
import math
import socket
import statistics
import sys
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import NamedTuple
from typing import Optional

from apache_beam.metrics.metric import Metrics
from apache_beam.metrics.metricbase import MetricName

__all__ = [
    'AutoscalingConfig',
    'NUM_LOADED_MODELS_NAMESPACE',
    'PrometheusNumLoadedModelsPublisher',
    'ServerMetricNames',
    'num_loaded_models_name',
]

_LOGGER = logging.getLogger(__name__)

# The namespace of the distribution num_loaded_models_<tag>, which
# RunInference's model manager publishes and the publisher below too.
NUM_LOADED_MODELS_NAMESPACE = 'BeamML_ModelManager'


def num_loaded_models_name(tag: str) -> str:
  """The name of the distribution that reports the capacity for ``tag``."""
  return f'num_loaded_models_{tag}'


# A scrape reads at most this much of a page: a vLLM server's page is
# 60-150 KB, and a bigger one is read no further, so that a poll stays cheap.
_MAX_PAGE_BYTES = 2 << 20
# The longest a socket operation of a scrape may block.
_MAX_SOCKET_TIMEOUT_SECS = 2.0
# How long stop() lets the thread finish its last scrape before it cuts the
# connection, and then how long it waits for the thread to end.
_STOP_GRACE_SECS = 0.25
_STOP_JOIN_SECS = 1.0
# A scrape finds the server queueing when requests of this many batches
# wait: more than those of the batch it is taking in, whose requests queue
# behind each other to be prefilled however idle the server is.
_QUEUED_BATCHES = 2
# While it queues, a server whose running count rose by more than this
# factor over config.saturated_queue_secs is still taking in a load that
# arrived at once, not saturated.
_PLATEAU = 1.1
# A new window's median replaces the capacity only when it differs by more
# than this share, so that the noise of the samples does not move the value
# across a worker count and back.
_STABILITY = 0.1
# Before its first measurement, a publisher offers at most this many times
# the most batches it has served without queueing (and at least the
# geometric mean of those and its prior), or, without a prior, twice as
# many. The less it offers above what it served, the less a worker that
# joins a measured pool pulls the pool below what it needs; 1.5 still lets
# a pool whose prior is right shrink to it in a few decisions.
_PROBE = 1.5
_PROBE_WITHOUT_PRIOR = 2


def _check_positive(name: str, value: Any, integer: bool = False) -> None:
  kinds = (int, ) if integer else (int, float)
  if isinstance(value, bool) or not isinstance(value, kinds):
    kind = 'an int' if integer else 'a number'
    raise TypeError(f'{name} must be {kind}, got {value!r}.')
  if not math.isfinite(value) or value <= 0:
    raise ValueError(f'{name} must be positive and finite, got {value!r}.')


def _check_fraction(name: str, value: Any) -> None:
  _check_positive(name, value)
  if value > 1:
    raise ValueError(f'{name} must be in (0, 1], got {value!r}.')


def _check_name(name: str, value: Any) -> None:
  if not isinstance(value, str):
    raise TypeError(f'{name} must be a str, got {value!r}.')
  if not value:
    raise ValueError(f'{name} must not be empty.')


@dataclasses.dataclass(frozen=True)
class AutoscalingConfig:
  """How PrometheusNumLoadedModelsPublisher measures and publishes.

  Args:
    poll_interval_secs: seconds between two scrapes of the server's metrics.
    window_secs: the capacity is the median of the saturated intervals of the
      last window_secs; at least poll_interval_secs.
    hold_secs: how long a measured capacity is kept once no interval is
      saturated any more (lulls, idle periods, a restarted server), and how
      long the publisher remembers the load it served. After that it
      estimates the capacity again as before its first measurement, at most
      twice what it measured. At least window_secs.
    target_utilization: in (0, 1]. The published value is the capacity times
      this: 0.8 leaves a fifth of every server as headroom, so that the pool
      grows before its servers saturate. 1 (the default) leaves none.
    max_running_requests: optional. The most requests the server runs at
      once (vLLM's ``max_num_seqs``), for the prior: an upper bound on the
      capacity before the first measurement, in batches of the requests the
      server holds per batch in flight.
    saturated_cache_usage: in (0, 1]. An interval is saturated when the
      server's cache usage is at least this at both ends.
    saturated_queue_secs: an interval is saturated when requests of at least
      two batches have waited at every scrape for this long, while the
      server's running count stayed within 10%.
    settle_secs: before its first measurement, the publisher publishes
      nothing until the load it serves has stopped growing for this long, so
      that a worker still taking its share of the load does not report a
      fraction of it.
  """
  poll_interval_secs: float = 5
  window_secs: float = 300
  hold_secs: float = 3600
  target_utilization: float = 1.0
  max_running_requests: Optional[int] = None
  saturated_cache_usage: float = 0.9
  saturated_queue_secs: float = 60
  settle_secs: float = 180

  def __post_init__(self):
    _check_positive('poll_interval_secs', self.poll_interval_secs)
    _check_positive('window_secs', self.window_secs)
    _check_positive('hold_secs', self.hold_secs)
    if self.window_secs < self.poll_interval_secs:
      raise ValueError(
          f'window_secs ({self.window_secs!r}) must be at least '
          f'poll_interval_secs ({self.poll_interval_secs!r}).')
    if self.hold_secs < self.window_secs:
      raise ValueError(
          f'hold_secs ({self.hold_secs!r}) must be at least '
          f'window_secs ({self.window_secs!r}).')
    _check_fraction('target_utilization', self.target_utilization)
    if self.max_running_requests is not None:
      _check_positive(
          'max_running_requests', self.max_running_requests, integer=True)
    _check_fraction('saturated_cache_usage', self.saturated_cache_usage)
    _check_positive('saturated_queue_secs', self.saturated_queue_secs)
    _check_positive('settle_secs', self.settle_secs)


@dataclasses.dataclass(frozen=True)
class ServerMetricNames:
  """The names, as scraped, of the server metrics the publisher reads.

  Args:
    running: the gauge of requests the server is running.
    waiting: the gauge of requests waiting to run.
    cache_usage: optional. The gauge of the share of the server's cache (its
      KV cache) in use, from 0 to 1.
    preemptions: optional. The counter of requests the server preempted
      (put back to waiting) because its cache was full.
    finished: optional. The counter of requests the server finished, over
      all its labels. When given, the server is measured only once it has
      finished as many requests as it runs: until then its requests are
      young, hold little of the cache, and a server whose cache bounds it
      runs more of them than it will once they have grown; and a restarted
      server is still taking in the load that waited for it.
  """
  running: str
  waiting: str
  cache_usage: Optional[str] = None
  preemptions: Optional[str] = None
  finished: Optional[str] = None

  def __post_init__(self):
    _check_name('running', self.running)
    _check_name('waiting', self.waiting)
    if self.cache_usage is not None:
      _check_name('cache_usage', self.cache_usage)
    if self.preemptions is not None:
      _check_name('preemptions', self.preemptions)
    if self.finished is not None:
      _check_name('finished', self.finished)


class _Scrape(NamedTuple):
  time: float
  running: float
  waiting: float
  cache_usage: Optional[float]
  preemptions: Optional[float]
  batches: int
  requests: int


def _read_samples(text: str, prefixes: tuple) -> dict[str, list[float]]:
  """The values of the samples of Prometheus text whose lines start with one
  of prefixes, by sample name. Labels are not read: every metric is summed
  (or maxed) over all its series. Raises ValueError on such a line that is
  not a sample."""
  values: dict[str, list[float]] = collections.defaultdict(list)
  for line in text.splitlines():
    if not line.startswith(prefixes):
      continue
    brace = line.find('{')
    if brace >= 0:
      # A label value may hold spaces or braces, the value and timestamp
      # after the labels do not.
      name, rest = line[:brace], line[line.rindex('}') + 1:]
    else:
      name, _, rest = line.partition(' ')
    fields = rest.split()
    if not 1 <= len(fields) <= 2:
      raise ValueError(f'Not a sample: {line[:100]!r}')
    values[name].append(float(fields[0]))
  return values


class PrometheusNumLoadedModelsPublisher:
  """Publishes how many batches an inference server can serve at once.

  A background thread scrapes the server's Prometheus metrics at
  ``metrics_url`` every ``config.poll_interval_secs`` and publishes to the
  process-wide distribution ``num_loaded_models_<tag>`` in the namespace
  ``BeamML_ModelManager``, where RunInference's model manager publishes how
  many models a worker has loaded, at every poll.

  What it publishes is capacity, not load, and it measures it only while
  the server is saturated, when its running count is what it can run rather
  than what it is given. An interval between two scrapes is saturated when
  the server's cache usage is at least ``config.saturated_cache_usage`` at
  both ends, or it preempted requests in between, or requests of at least
  two of the batches in flight have waited at every scrape for
  ``config.saturated_queue_secs`` while its running count stayed within
  10%. Two batches, because a server prefilling long prompts makes the
  requests of the batch it is taking in wait for each other however idle
  it is; a steady running count, because a server still taking in a load
  that arrived at once also has a queue for a while. With
  ``metric_names.finished``, the server is measured only once it has
  finished as many requests as it runs.

  The batches come from the client's own count of the batches in flight
  (``batch_started`` less ``batch_finished``) and of their requests: the
  requests waiting at a saturated server are whole batches behind the ones
  it serves, so it serves ``batches * (1 - waiting / requests)`` batches at
  once (the mean over both ends is one sample). Counting the batches in
  flight counts a batch whose last requests still run, as RunInference
  waits for all of them, where dividing the running count by the size of
  the batches sent would not. The capacity is the median of the samples of
  the last ``config.window_secs``; it moves only when that median differs
  from it by more than 10%. Once no interval is saturated (the load fell,
  the server idles or restarted), it is held for ``config.hold_secs``.

  Before the first measurement the publisher estimates the capacity from
  above and from below. From above, its prior: ``max_running_requests``
  over the requests the server holds per batch in flight (over the hold;
  the mean size of the batches sent before the server held any). From
  below, the most batches it has had in flight without
  saturating during the hold, ``load``: it serves at least that many. It
  publishes ``min(prior, max(1.5 * load, sqrt(load * prior)))``, or
  ``2 * load`` without a prior: in a pool that has never saturated, each
  autoscaling decision then shrinks the pool until its servers saturate,
  which measures them, without a worker offering more than twice what it
  has served. It publishes nothing before its load has stopped growing for
  ``config.settle_secs``, nor without load: never 1 for "unknown". After the
  hold it estimates again, offering at most twice the capacity it measured.

  The published value is the capacity times ``config.target_utilization``,
  rounded, and at least 1. A scrape that fails (unreachable server, an HTTP
  error, a page larger than 2 MiB, text that does not parse, a metric that
  is missing, not finite or negative) is logged and changes nothing:
  polling goes on and the last value is published again. A counter that
  goes down was reset. ``set_metrics_url`` points the publisher at a
  restarted server and keeps what it measured. ``stop()`` publishes 0 and
  ends the thread within 2 seconds, whatever the server does; so does the
  collection of ``owner``, without waiting.

  Args:
    metrics_url: the server's Prometheus text endpoint, e.g.
      ``http://localhost:8000/metrics``.
    tag: the model tag RunInference knows the model by (see
      ModelHandler.set_model_identifier).
    metric_names: a ServerMetricNames: the names of the server's metrics.
    config: an AutoscalingConfig; the defaults when None.
    counters: optional. Server counters to republish, a mapping from the
      scraped sample name (e.g. ``vllm:prefix_cache_hits_total``) to a Beam
      counter name. Each scrape adds their increases to process-wide Beam
      counters in ``counters_namespace``; the first scrape of a server adds
      their values since it started, and so does a reset.
    counters_namespace: the namespace of those counters; required with them.
    owner: optional. An object whose collection stops the publisher. The
      publisher holds only a weak reference to it.
    clock: optional. Returns the time in seconds; time.monotonic by
      default. For tests, with ``fetch``.
    fetch: optional. Returns the text at a URL; an HTTP GET with the limits
      above by default.
  """
  def __init__(
      self,
      metrics_url: str,
      tag: str,
      metric_names: ServerMetricNames,
      config: Optional[AutoscalingConfig] = None,
      *,
      counters: Optional[Mapping[str, str]] = None,
      counters_namespace: Optional[str] = None,
      owner: Optional[object] = None,
      clock: Callable[[], float] = time.monotonic,
      fetch: Optional[Callable[[str], str]] = None):
    _check_name('metrics_url', metrics_url)
    _check_name('tag', tag)
    if not isinstance(metric_names, ServerMetricNames):
      raise TypeError(
          f'metric_names must be a ServerMetricNames, got {metric_names!r}.')
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
      _check_name('counters_namespace', counters_namespace)
    self._url = metrics_url
    self._scraped_url = metrics_url
    self._tag = tag
    self._names = metric_names
    self._config = config
    self._clock = clock
    self._fetch = fetch or self._http_get
    self._timeout = min(config.poll_interval_secs, _MAX_SOCKET_TIMEOUT_SECS)
    self._distribution = Metrics.distribution(
        NUM_LOADED_MODELS_NAMESPACE,
        num_loaded_models_name(tag),
        process_wide=True)
    self._counters = {
        source: Metrics.DelegatingCounter(
            MetricName(counters_namespace, name), process_wide=True)
        for source, name in counters.items()
    }
    gauges = [metric_names.running, metric_names.waiting]
    if metric_names.cache_usage:
      gauges.append(metric_names.cache_usage)
    wanted = gauges + [
        name for name in
        [metric_names.preemptions, metric_names.finished, *counters] if name
    ]
    # Only the lines of these metrics are parsed.
    self._line_prefixes = tuple(
        name + end for name in wanted for end in ('{', ' '))
    self._counter_values: dict[str, float] = {}
    self._lock = threading.Lock()
    # Guarded by _lock: the batches and requests in flight, and those sent.
    self._batches_in_flight = 0
    self._requests_in_flight = 0
    self._batches_sent = 0
    self._requests_sent = 0
    # The socket of the scrape in progress, which stop() may cut.
    self._socket: Optional[socket.socket] = None
    self._aborted = False
    # The polling thread's own state.
    self._last: Optional[_Scrape] = None
    # (time, running) of the scrapes since they began to find the server
    # queueing, every time.
    self._queued: collections.deque = collections.deque()
    # (time, batches the server served at once) of the saturated intervals
    # of the window.
    self._samples: collections.deque = collections.deque()
    self._new_samples = False
    # (time, batches in flight, requests the server held) of the scrapes of
    # the hold with batches in flight, and their sums.
    self._sizes: collections.deque = collections.deque()
    self._held_batches = 0
    self._held_requests = 0.0
    # (time, batches in flight) of the unsaturated scrapes of the hold, each
    # more than any after it: the first is the most of the hold.
    self._loads: collections.deque = collections.deque()
    self._load_rose_at = -math.inf
    self._capacity: Optional[float] = None
    self._measured: Optional[float] = None
    self._measured_at = -math.inf
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

  def batch_started(self, num_requests: int) -> None:
    """Notes that a batch of num_requests requests was sent to the server."""
    self._check_batch(num_requests)
    with self._lock:
      self._batches_in_flight += 1
      self._requests_in_flight += num_requests
      self._batches_sent += 1
      self._requests_sent += num_requests

  def batch_finished(self, num_requests: int) -> None:
    """Notes that a batch sent with batch_started got all its responses, or
    failed."""
    self._check_batch(num_requests)
    with self._lock:
      self._batches_in_flight = max(0, self._batches_in_flight - 1)
      self._requests_in_flight = max(0, self._requests_in_flight - num_requests)

  @staticmethod
  def _check_batch(num_requests: int) -> None:
    if isinstance(num_requests, bool) or not isinstance(num_requests, int):
      raise TypeError(f'num_requests must be an int, got {num_requests!r}.')
    if num_requests < 0:
      raise ValueError(
          f'num_requests must not be negative, got {num_requests!r}.')

  def set_metrics_url(self, metrics_url: str) -> None:
    """Points the publisher at a restarted server. What it measured is kept;
    the new server's counters count from its start."""
    _check_name('metrics_url', metrics_url)
    with self._lock:
      self._url = metrics_url

  def start(self) -> None:
    """Starts the polling thread; a publisher starts once."""
    with self._lock:
      if self._thread is not None:
        raise RuntimeError('The publisher was already started.')
      self._thread = threading.Thread(
          target=self._run,
          name=f'PrometheusNumLoadedModelsPublisher-{self._tag}',
          daemon=True)
    self._thread.start()

  def stop(self) -> None:
    """Stops the polling thread: it scrapes a last time for the counters,
    publishes 0 and ends. Returns within 2 seconds, with the thread ended
    unless called from the thread itself."""
    self._stopping.set()
    if self._finalizer is not None:
      self._finalizer.detach()
    thread = self._thread
    if (thread is None or thread is threading.current_thread() or
        sys.is_finalizing()):
      return
    thread.join(_STOP_GRACE_SECS)
    if thread.is_alive():
      # The server is slow to answer: cut the connection the thread waits on.
      with self._lock:
        self._aborted = True
        sock = self._socket
      if sock is not None:
        try:
          sock.shutdown(socket.SHUT_RDWR)
        except OSError:
          pass
      thread.join(_STOP_JOIN_SECS)

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
    """Scrapes the server once and publishes the current value."""
    now = self._scrape()
    if now is None:
      now = self._clock()
    if self._expire(now) and self._samples:
      median = statistics.median(s for _, s in self._samples)
      if (self._capacity is None or
          abs(median - self._capacity) > _STABILITY * self._capacity):
        self._capacity = median
      self._measured = self._capacity
    elif (self._capacity is not None and
          now - self._measured_at > self._config.hold_secs):
      _LOGGER.info(
          'Publisher %s saw no saturated interval for %s s; it estimates '
          'the capacity again until it measures.',
          self._tag,
          self._config.hold_secs)
      self._capacity = None
    capacity = self._capacity
    if capacity is None:
      capacity = self._estimate()
    if capacity is not None and math.isfinite(capacity):
      self._publish(
          max(1, int(capacity * self._config.target_utilization + 0.5)))

  def _expire(self, now: float) -> bool:
    """Forgets the samples older than the window, and the loads and sizes
    older than the hold; returns whether the samples changed since the last
    call."""
    changed, self._new_samples = self._new_samples, False
    cutoff = now - self._config.window_secs
    while self._samples and self._samples[0][0] < cutoff:
      self._samples.popleft()
      changed = True
    cutoff = now - self._config.hold_secs
    while self._loads and self._loads[0][0] < cutoff:
      self._loads.popleft()
    while self._sizes and self._sizes[0][0] < cutoff:
      _, batches, held = self._sizes.popleft()
      self._held_batches -= batches
      self._held_requests -= held
    return changed

  def _prior(self) -> Optional[float]:
    """The most batches the server can serve at once by its configuration:
    max_running_requests over the requests it holds per batch in flight."""
    limit = self._config.max_running_requests
    if limit is None:
      return None
    if self._held_batches:
      size = self._held_requests / self._held_batches
    else:
      with self._lock:
        batches, requests = self._batches_sent, self._requests_sent
      size = requests / batches if batches else 0
    return limit / size if size > 0 else None

  def _estimate(self) -> Optional[float]:
    """The capacity to publish while none is measured: between the most
    batches served without queueing and the prior, at most twice the former
    (and twice what was measured last), or None."""
    if not self._loads:
      return None
    now, load = self._loads[-1][0], self._loads[0][1]
    if self._value is None and now - self._load_rose_at < (
        self._config.settle_secs):
      return None
    prior = self._prior()
    if prior is None:
      value = _PROBE_WITHOUT_PRIOR * load
    else:
      value = min(prior, max(_PROBE * load, math.sqrt(load * prior)))
    if self._measured is not None:
      value = min(value, 2 * self._measured)
    return value

  def _http_get(self, url: str) -> str:
    """GETs url with a bounded page size and socket operations that stop()
    can cut, connecting included."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path or '/'
    if parts.query:
      path += '?' + parts.query
    host = parts.hostname or 'localhost'
    connection = http.client.HTTPConnection(
        host, parts.port, timeout=self._timeout)
    try:
      connection.sock = self._connect(host, parts.port or 80)
      connection.request('GET', path)
      response = connection.getresponse()
      if response.status != 200:
        raise IOError(f'HTTP status {response.status} {response.reason}')
      chunks, size = [], 0
      deadline = time.monotonic() + self._config.poll_interval_secs
      while True:
        chunk = response.read1(1 << 16)
        if not chunk:
          break
        size += len(chunk)
        if size > _MAX_PAGE_BYTES:
          raise ValueError(f'the page is larger than {_MAX_PAGE_BYTES} bytes')
        if time.monotonic() > deadline:
          raise TimeoutError('the page took longer than a poll interval')
        chunks.append(chunk)
    finally:
      with self._lock:
        self._socket = None
      connection.close()
    return b''.join(chunks).decode('utf-8', errors='replace')

  def _connect(self, host: str, port: int) -> socket.socket:
    """A socket connected to host and port, which stop() can cut while it
    connects: it is known to stop() before it connects."""
    error: Optional[OSError] = None
    for family, kind, protocol, _, address in socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM):
      sock = socket.socket(family, kind, protocol)
      with self._lock:
        if self._aborted:
          sock.close()
          raise ConnectionAbortedError('The publisher is stopping.')
        self._socket = sock
      try:
        sock.settimeout(self._timeout)
        sock.connect(address)
        return sock
      except OSError as e:
        with self._lock:
          self._socket = None
        sock.close()
        if self._aborted:
          raise ConnectionAbortedError('The publisher is stopping.') from e
        error = e
    raise error or OSError(f'cannot resolve {host!r}')

  def _scrape(self) -> Optional[float]:
    """Fetches and reads the server's metrics; returns the scrape's time, or
    None when it failed."""
    with self._lock:
      url = self._url
    try:
      text = self._fetch(url)
      now = self._clock()
      values = _read_samples(text, self._line_prefixes)
    except Exception as e:  # pylint: disable=broad-except
      self._report(f'cannot read {url}: {e!r}')
      return None
    with self._lock:
      if url != self._url:
        return None
      restarted = url != self._scraped_url
      self._scraped_url = url
    if restarted:
      # A new server: nothing spans the restart, its counters start at 0.
      self._last = None
      self._counter_values = {}
    self._read_counters(values)
    problem = self._observe(now, values)
    self._report(f'{url}: {problem}' if problem else None)
    return now

  def _read_counters(self, values: Mapping[str, list[float]]) -> None:
    for source, counter in self._counters.items():
      current = _total(values.get(source))
      if current is None:
        continue
      previous = self._counter_values.get(source, 0.0)
      # A counter that went down was reset and counts from 0 again.
      increase = current - previous if current >= previous else current
      self._counter_values[source] = current
      if increase > 0:
        counter.inc(int(round(increase)))

  def _observe(self, now: float, values: Mapping[str,
                                                 list[float]]) -> Optional[str]:
    """Adds a sample when the interval since the last scrape was saturated,
    and notes the load otherwise; returns what is wrong with the metrics, if
    anything."""
    names = self._names
    running = _total(values.get(names.running))
    waiting = _total(values.get(names.waiting))
    cache_usage = preemptions = None
    if names.cache_usage:
      usage = values.get(names.cache_usage)
      cache_usage = max(usage) if usage and _total(usage) is not None else None
    if names.preemptions:
      preemptions = _total(values.get(names.preemptions))
    last, self._last = self._last, None
    if running is None or waiting is None:
      bad = [
          name for name, value in ((names.running, running),
                                   (names.waiting, waiting)) if value is None
      ]
      return f'no finite, non-negative {" or ".join(bad)}'
    with self._lock:
      batches, requests = self._batches_in_flight, self._requests_in_flight
    current = _Scrape(
        now, running, waiting, cache_usage, preemptions, batches, requests)
    self._last = current
    if last is None or not _queued(current):
      self._queued.clear()
    if _queued(current):
      self._queued.append((now, running))
    if batches and running + waiting:
      self._sizes.append((now, batches, running + waiting))
      self._held_batches += batches
      self._held_requests += running + waiting
    if last is None or current.time <= last.time:
      return None
    warm = True
    if names.finished:
      finished = _total(values.get(names.finished))
      warm = finished is not None and finished > 0 and finished >= running
    if warm and self._saturated(last, current):
      ends = [_served(end) for end in (last, current)]
      served = [end for end in ends if end is not None]
      if served:
        self._samples.append((now, sum(served) / len(served)))
        self._new_samples = True
        self._measured_at = now
    elif batches and not _queued(current):
      self._note_load(now, batches)
    return None

  def _note_load(self, now: float, batches: int) -> None:
    """Notes that the server served batches without queueing."""
    loads = self._loads
    if not loads or batches > loads[0][1]:
      self._load_rose_at = now
    while loads and loads[-1][1] <= batches:
      loads.pop()
    loads.append((now, batches))

  def _saturated(self, first: _Scrape, second: _Scrape) -> bool:
    threshold = self._config.saturated_cache_usage
    if (first.cache_usage is not None and second.cache_usage is not None and
        min(first.cache_usage, second.cache_usage) >= threshold):
      return True
    if (first.preemptions is not None and second.preemptions is not None and
        second.preemptions > first.preemptions):
      return True
    queued = self._queued
    span = self._config.saturated_queue_secs
    if not queued or second.time - queued[0][0] < span:
      return False
    while len(queued) > 1 and second.time - queued[1][0] >= span:
      queued.popleft()
    return second.running <= _PLATEAU * queued[0][1]

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


def _queued(scrape: _Scrape) -> bool:
  """Whether requests of two batches in flight, or more, wait."""
  return bool(
      scrape.batches and
      scrape.waiting * scrape.batches >= _QUEUED_BATCHES * scrape.requests)


def _served(scrape: _Scrape) -> Optional[float]:
  """The batches a saturated server serves at once: those in flight less the
  whole batches whose requests wait (as many as the waiting requests over the
  requests per batch in flight)."""
  if not scrape.batches or not scrape.requests or not scrape.running:
    return None
  served = scrape.batches * (1 - scrape.waiting / scrape.requests)
  return served if served > 0 else None


def _total(values: Optional[list[float]]) -> Optional[float]:
  """The sum of a metric's samples; None when it has none, or one that is not
  finite or is negative."""
  if not values:
    return None
  total = sum(values) if len(values) > 1 else values[0]
  if not math.isfinite(total) or min(values) < 0:
    return None
  return total
