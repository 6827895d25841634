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

Two parts: ``CapacityEstimator``, a pure object fed the scrapes of a server
and the batches sent to it, each with a time, which answers the value; and
the publisher, a thread that scrapes the server, feeds the estimator and
publishes its value at every poll.

The runner contract. A Beam distribution reaches a runner as a cumulative
count, sum, min and max per process, since the process started. From two
such reports a runner can take the mean of the values published between
them (the change in the sum over the change in the count), and the value
is designed for that mean: each poll publishes the worker's current answer,
so a recent window holds only current answers. It serves as well a runner
that sees each published value and reads the last one, or a window's min.
Which statistic Dataflow reads is not documented; that it reads a recent
one is an assumption, the one the model manager's own use of this
distribution makes (it publishes the number of models loaded whenever it
changes). The lifetime min or max, which the cumulative distribution
carries, cannot be served: to find a server's capacity without a
measurement, a worker must offer more than its load, so that the pool
shrinks until a server saturates and is measured, and then publish what it
measured; a value right under the lifetime min and max could never change,
so it could not probe, and a stopping publisher publishes 0. A windowed
max is served once every worker has measured, but it is any one worker's
value: while a worker that joined probes above the others, the pool
shrinks by it, and where the right size does not saturate the servers it
can churn.

This module imports without torch, so that code which only needs the name
of the distribution (``NUM_LOADED_MODELS_NAMESPACE``,
``num_loaded_models_name``) need not import the model manager.
"""

import collections
import dataclasses
import http.client
import itertools
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
    'CapacityEstimator',
    'NUM_LOADED_MODELS_NAMESPACE',
    'PrometheusNumLoadedModelsPublisher',
    'ServerMetricNames',
    'ServerScrape',
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
# The longest a scrape may take in all, connecting, headers and page
# included: a poll interval, but at least 1 s and at most 4 s; and the
# longest a socket operation of it may block.
_MIN_SCRAPE_SECS = 1.0
_MAX_SCRAPE_SECS = 4.0
# Two scrapes further apart than this many poll intervals (and a scrape's
# time limit) span failed scrapes or a stalled thread: no interval between
# them is judged saturated, since a preemption or a full cache in a gap of
# minutes says nothing of what the server ran at either end.
_MAX_INTERVAL_POLLS = 2
_MAX_SOCKET_TIMEOUT_SECS = 2.0
# How long stop() lets the thread finish its last scrape before it cuts the
# connection, and then how long it waits for the thread to end.
_STOP_GRACE_SECS = 0.25
_STOP_JOIN_SECS = 1.0
# A scrape finds the server queueing when requests of this many of the
# client's batches wait: more than those of the batch it is taking in, whose
# requests queue behind each other to be prefilled however idle the server
# is.
_QUEUED_BATCHES = 2
# The server is saturated by its queue when at least this share of the
# scrapes of config.saturated_queue_secs found it queueing. Not every one:
# with outputs of one length a batch's requests end together, and the queue
# drains for the moment the worker's threads take to send their next batches.
_QUEUED_SHARE = 0.5
# While it queues, a server whose running requests rose by more than this
# factor, from the least of the first half of config.saturated_queue_secs to
# the most of the second, is still taking in a load that arrived at once,
# not saturated.
_PLATEAU = 1.1
# A new window's median replaces the capacity only when it differs by more
# than this share, so that the noise of the samples does not move the value
# across a worker count and back.
_STABILITY = 0.1
# Once the hold has passed without a saturated scrape, a measured capacity
# is estimated again only if the hold showed room for at least this many
# times it: the server served that many batches without queueing; for a
# capacity a queue bounded, its batches hold that many times fewer
# requests; or, for a capacity its full cache bounded, its cache would
# hold them (the requests grew shorter). A pool gives each worker at most
# the capacity it published, so only the batches' sizes and the cache show
# room in a pool that is right. A server that was simply not pushed to its
# capacity (the pool is right, or the load fell) whose batches and cache
# show no room keeps it: a re-estimate offers more than the load, and in a
# pool that was right that moves the pool by a worker and back.
_OUTGROWN = 1.25
# Before its first measurement, an estimator offers at most this many times
# the most batches it has served without queueing (and at least the
# geometric mean of those and its prior), or, without a prior, twice as
# many. The less it offers above what it served, the less a worker that
# joins a measured pool pulls the pool below what it needs; 1.75 lets a
# pool whose prior is right shrink to it within 10 minutes under a windowed
# min, which holds the estimate of the tick before each shrink a tick more
# (1.5 took 12 minutes from 16 and 48 workers).
_PROBE = 1.75
_PROBE_WITHOUT_PRIOR = 2
# The geometric mean of the load and the prior is offered only while the
# load is below this fraction of the prior: a pool far larger than it needs
# then shrinks in a few decisions, while a worker that joins a pool near
# its size offers only 1.75 times its share.
_FAR_BELOW = 4
# A batch in flight for longer than this many times the longest batch that
# finished over the hold, and at least _MIN_EXPIRY_SECS, is taken as lost
# (its client process died without finishing it) and no longer counted. One
# that finishes after all counts among those that finished, so that batches
# that grew longer (a queue that formed) are soon kept again.
_EXPIRY_FACTOR = 4
_MIN_EXPIRY_SECS = 300
# A server that holds more than this many times the requests its client has
# in flight serves other clients too, or more than one sequence per request
# (sampling with n > 1); the estimator counts its share and says so.
_FOREIGN_REQUESTS = 1.5


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


def _check_http_url(name: str, value: Any) -> None:
  """Raises unless value is a URL that the built-in fetch can GET: plain
  HTTP, with a host and a valid port."""
  _check_name(name, value)
  try:
    parts = urllib.parse.urlsplit(value)
    valid = parts.scheme == 'http' and bool(parts.hostname) and parts.port != 0
  except ValueError:
    # A port that is not a number or is out of range.
    valid = False
  if not valid:
    raise ValueError(
        f'{name} must be an http:// URL with a host (the publisher GETs it '
        f'over plain HTTP unless given a fetch), got {value!r}.')


def _check_name(name: str, value: Any) -> None:
  if not isinstance(value, str):
    raise TypeError(f'{name} must be a str, got {value!r}.')
  if not value:
    raise ValueError(f'{name} must not be empty.')


@dataclasses.dataclass(frozen=True)
class AutoscalingConfig:
  """How CapacityEstimator measures and PrometheusNumLoadedModelsPublisher
  publishes.

  Args:
    poll_interval_secs: seconds between two scrapes of the server's metrics.
    window_secs: the capacity is the median of the saturated scrapes of the
      last window_secs; at least poll_interval_secs.
    hold_secs: how long a measured capacity is kept once no scrape is
      saturated any more (lulls, idle periods, a restarted server), and how
      long the estimator remembers the load it served. After that it
      estimates the capacity again as before its first measurement, from
      1.25 to 2 times what it measured, if the hold showed room for 1.25
      times it (see CapacityEstimator); otherwise it keeps it. At least
      window_secs.
    target_utilization: in (0, 1]. A measured capacity is published times
      this: 0.8 leaves a fifth of every server as headroom, so that the pool
      grows before its servers saturate; the pool settles at
      ceil(demand / (target_utilization * capacity)). Estimates are not
      scaled: they probe for a saturation, which measures the server. 1
      (the default) leaves no headroom.
    max_running_requests: optional. The most requests the server runs at
      once (vLLM's ``max_num_seqs``), for the prior: an upper bound on the
      capacity before the first measurement, in batches of the requests the
      server holds per batch in flight.
    max_batches_in_flight: optional. The most batches the worker can have
      in flight at once: the DoFn threads
      (``--number_of_worker_harness_threads``) times the SDK processes that
      share the server. The value is never more than that, since a worker
      cannot use more: a server that a worker's threads never saturate is
      never measured, and its estimate would stay above them (up to 1.75
      times, or 2 without a prior, what the worker sends), so that a pool
      sized by it would stay too small and keep a backlog. Not a count
      of the threads seen sending, which would follow the load. The vLLM
      handlers set it, when it is not given, from the pipeline options when
      they bound the threads and run one SDK process per worker (see
      apache_beam.ml.inference.base.WorkerInfo); when they do not, the
      value has no such cap.
    saturated_cache_usage: in (0, 1]. An interval between two scrapes is
      saturated when the server's cache usage is at least this at both ends.
    saturated_queue_secs: a scrape is saturated when requests of at least
      two batches wait at it and at half the scrapes of the last
      saturated_queue_secs, while the server's most running requests rose by
      at most 10% over them. At least twice poll_interval_secs.
    settle_secs: before its first measurement, nothing is published until
      the load the worker serves has stopped growing for this long, so that
      a worker still taking its share of the load does not report a
      fraction of it.
  """
  poll_interval_secs: float = 5
  window_secs: float = 300
  hold_secs: float = 3600
  target_utilization: float = 1.0
  max_running_requests: Optional[int] = None
  max_batches_in_flight: Optional[int] = None
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
    if self.max_batches_in_flight is not None:
      _check_positive(
          'max_batches_in_flight', self.max_batches_in_flight, integer=True)
    _check_fraction('saturated_cache_usage', self.saturated_cache_usage)
    _check_positive('saturated_queue_secs', self.saturated_queue_secs)
    if self.saturated_queue_secs < 2 * self.poll_interval_secs:
      # The queue rule compares the scrapes of the span's two halves.
      raise ValueError(
          f'saturated_queue_secs ({self.saturated_queue_secs!r}) must be at '
          f'least twice poll_interval_secs ({self.poll_interval_secs!r}).')
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
      server is still taking in the load that waited for it. A page without
      it is logged, and measured without that check.
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


class ServerScrape(NamedTuple):
  """What one scrape of a server read (see ServerMetricNames); None for a
  metric that was not scraped."""
  running: float
  waiting: float
  cache_usage: Optional[float] = None
  preemptions: Optional[float] = None
  finished: Optional[float] = None


class _Point(NamedTuple):
  """A scrape with the client's batches and requests in flight then."""
  time: float
  scrape: ServerScrape
  batches: int
  requests: int

  def waiting(self) -> float:
    """The client's share of the requests waiting: its requests over those
    the server holds, when the server holds more (other clients, or n > 1
    sequences per request)."""
    held = self.scrape.running + self.scrape.waiting
    if held > self.requests:
      return self.scrape.waiting * self.requests / held
    return self.scrape.waiting

  def queued(self) -> bool:
    """Whether requests of two of the client's batches in flight, or more,
    wait."""
    return bool(
        self.batches and
        self.waiting() * self.batches >= _QUEUED_BATCHES * self.requests)

  def served(self) -> Optional[float]:
    """The client's batches a saturated server serves at once: those in
    flight less the whole batches whose requests wait (as many as its waiting
    requests over its requests per batch in flight)."""
    if not self.batches or not self.requests or not self.scrape.running:
      return None
    served = self.batches * (1 - self.waiting() / self.requests)
    return served if served > 0 else None


class CapacityEstimator:
  """How many batches an inference server can serve at once, from its
  metrics and the batches a client sends it.

  A pure object: it is told the scrapes of the server (``observe``) and the
  batches sent (``batch_started``, ``batch_finished``), each with a time,
  and answers the value to publish (``value``), with any number of scrapes
  between two values. It starts no thread, reads no clock and makes no
  request; it is not thread-safe.

  What it answers is capacity, not load, and it measures it only while the
  server is saturated, when its running count is what it can run rather
  than what it is given. A scrape is saturated when the server's cache usage
  was at least ``config.saturated_cache_usage`` at it and at the scrape
  before, or it preempted requests in between; or when requests of at least
  two of the client's batches in flight wait at it and at half the scrapes
  of the last ``config.saturated_queue_secs``, while the requests it runs
  rose by at most 10% from the first half of that span to the second.
  Two batches, because a server prefilling long prompts makes the requests
  of the batch it is taking in wait for each other however idle it is; half
  the scrapes, because with outputs of one length a batch's requests end
  together and the queue drains while their threads send again; a steady
  running count, because a server still taking in a load that arrived at
  once also has a queue for a while. With ``finished`` scraped, the server
  is measured only once it has finished as many requests as it runs.

  The batches come from the client's own records of its batches in flight
  and their requests, B and Q: the W requests waiting at a saturated server
  are whole batches behind the ones it serves, so it serves B * (1 - W / Q)
  batches at once. Counting the batches in flight counts a batch whose last
  requests still run, as RunInference waits for all of them. When the
  server holds more requests than Q (other clients, or sampling with
  n > 1), W is the client's share: W * Q / (running + waiting), so that two
  clients of one server each measure their share of it in proportion to
  their batches. The capacity is the median of the samples of the last
  ``config.window_secs``; it moves only when that median differs from it by
  more than 10%. Once no scrape is saturated (the load fell, the server idles
  or restarted), it is held for ``config.hold_secs``, and past it while the
  hold showed no room for 1.25 times it. Room is a server that served that
  many batches without queueing; for a capacity measured by a queue, batches
  that hold fewer requests (the queue bounds the requests the server runs, so
  it runs more of smaller batches): measured at 1.25 times the requests per
  batch in flight that the server held over the hold; or, for a capacity
  measured by a full cache, a cache that would hold that many batches below
  ``config.saturated_cache_usage`` at the most usage per batch in flight of
  the hold's scrapes without a queue (the requests grew shorter), where the
  prior allows them. A pool gives each worker at most what it published, so in
  a pool that is right only the batches' sizes and the cache can show room; a
  server that was not pushed to its capacity, and whose batches and cache show
  no room, says nothing against it, and probing again would move a pool that
  is right by a worker and back. Nor does an interval between scrapes more
  than two poll intervals (and a scrape's time limit) apart count as
  saturated: it spans failed scrapes.

  Before the first measurement, and after a hold that showed room,
  it estimates the capacity from above and from below. From above, its prior:
  ``max_running_requests`` over the requests the server holds per batch in
  flight. From below, the most batches in flight without queueing over the
  hold, ``load``: the server serves at least that many. The estimate is
  ``min(prior, 1.75 * load)``, or ``min(prior, sqrt(load * prior))`` while
  the load is below a quarter of the prior, or ``2 * load`` without a
  prior, and from 1.25 to 2 times a capacity measured before: in a pool
  that has never saturated, each autoscaling decision shrinks the pool
  until its servers saturate, which measures them, quickly while it is far
  too large; a worker that joins a pool near its size offers only 1.75 times
  its share, so that it does not make the pool churn. Nothing is answered
  before the load has stopped growing for ``config.settle_secs``, nor
  without load: never 1 for "unknown".

  A measured capacity is answered times ``config.target_utilization``; an
  estimate is not, so that it still probes. Either is at most
  ``config.max_batches_in_flight``, the batches the worker can have in
  flight. A batch in flight for more than 4 times the longest that
  finished over the hold (and 300 s), or for the whole hold when none
  finished, is taken as lost; if it finishes after all, its duration
  raises that limit, and the batches lost under the lower limit that the
  new one keeps are in flight again.

  Args:
    config: an AutoscalingConfig; the defaults when None.
  """
  def __init__(self, config: Optional[AutoscalingConfig] = None):
    if config is None:
      config = AutoscalingConfig()
    if not isinstance(config, AutoscalingConfig):
      raise TypeError(f'config must be an AutoscalingConfig, got {config!r}.')
    self._config = config
    # id -> (time started, requests) of the batches in flight.
    self._in_flight: dict[int, tuple[float, int]] = {}
    # id -> (time started, requests) of the batches taken as lost over the
    # hold, oldest first: one that finishes after all still counts among the
    # durations, and the others come back in flight if that raised the limit.
    self._lost: dict[int, tuple[float, int]] = {}
    self._next_batch = 0
    self._requests_in_flight = 0
    self._batches_sent = 0
    self._requests_sent = 0
    # (time, seconds) of the batches finished over the hold, each longer
    # than any after it: the first is the longest.
    self._durations: collections.deque = collections.deque()
    self._last: Optional[_Point] = None
    # (time, queued, running) of the scrapes of saturated_queue_secs, and
    # the time of the first scrape of the server.
    self._recent: collections.deque = collections.deque()
    self._first_scrape = math.inf
    # (time, batches the server served at once) of the saturated scrapes of
    # the window.
    self._samples: collections.deque = collections.deque()
    self._new_samples = False
    # (time, batches in flight, requests the server held for them) of the
    # scrapes of the hold with batches in flight, and their sums.
    self._sizes: collections.deque = collections.deque()
    self._held_batches = 0
    self._held_requests = 0.0
    # (time, batches in flight) of the unsaturated scrapes of the hold, each
    # more than any after it: the first is the most of the hold.
    self._loads: collections.deque = collections.deque()
    self._load_rose_at = -math.inf
    # (time, cache usage per batch in flight) of the same scrapes, each
    # more than any after it, and whether the last measurement found the
    # cache full (by usage or preemptions) rather than a queue alone.
    self._usage_per_batch: collections.deque = collections.deque()
    self._cache_bound = False
    # The requests the server held per batch in flight when it was last
    # measured.
    self._measured_size: Optional[float] = None
    self._capacity: Optional[float] = None
    self._measured: Optional[float] = None
    self._measured_at = -math.inf
    self._answered = False
    self._why: Optional[str] = 'no scrape yet'
    self._notes: list[str] = []

  @property
  def config(self) -> AutoscalingConfig:
    return self._config

  @property
  def measured(self) -> bool:
    """Whether the value answered last was measured, not estimated."""
    return self._capacity is not None

  @property
  def why_none(self) -> Optional[str]:
    """Why value() answered None last, or None when it answered a value."""
    return self._why

  def pop_notes(self) -> list[str]:
    """What changed that its user may log (a lost batch, a re-estimate, a
    shared server), since the last call."""
    notes, self._notes = self._notes, []
    return notes

  def batch_started(self, now: float, num_requests: int) -> int:
    """Notes that a batch of num_requests requests was sent at now; returns
    its id for batch_finished."""
    _check_now(now)
    _check_batch(num_requests)
    batch = self._next_batch
    self._next_batch += 1
    self._in_flight[batch] = (now, num_requests)
    self._requests_in_flight += num_requests
    self._batches_sent += 1
    self._requests_sent += num_requests
    return batch

  def batch_finished(self, now: float, batch: int) -> None:
    """Notes that the batch batch_started answered got all its responses,
    or failed, at now. A batch already taken as lost is no longer in
    flight, but its duration counts: batches longer than the limit raise it
    once one finishes."""
    _check_now(now)
    record = self._in_flight.pop(batch, None)
    if record is not None:
      started, requests = record
      self._requests_in_flight -= requests
    elif batch in self._lost:
      started, _ = self._lost.pop(batch)
    else:
      return
    duration = now - started
    durations = self._durations
    while durations and durations[-1][1] <= duration:
      durations.pop()
    durations.append((now, duration))

  @property
  def batches_in_flight(self) -> int:
    return len(self._in_flight)

  def server_restarted(self) -> None:
    """Notes that the scrapes now come from a new server process: no
    interval spans the restart."""
    self._last = None
    # The old server's scrapes stay in _recent until they expire, but no
    # queue is judged until the new server has been scraped for a whole
    # span, when they are out of it.
    self._first_scrape = math.inf

  def observe(self, now: float, scrape: ServerScrape) -> None:
    """Notes a scrape of the server at now.

    Raises:
      ValueError: if a metric of the scrape is not a finite number, or a
        count is negative (running and waiting must be given), or now is
        not a finite number.
    """
    _check_now(now)
    _check_scrape(scrape)
    # A sample that expires here leaves the capacity as it is: value()
    # recomputes it on new samples, and the hold re-estimates one that no
    # scrape confirms.
    self._expire(now)
    last = self._last
    if last is not None and now <= last.time:
      return
    if last is not None and now - last.time > (
        _MAX_INTERVAL_POLLS * self._config.poll_interval_secs +
        _MAX_SCRAPE_SECS):
      last = None
    point = _Point(now, scrape, len(self._in_flight), self._requests_in_flight)
    self._last = point
    self._first_scrape = min(self._first_scrape, now)
    held = scrape.running + scrape.waiting
    if point.batches and held > _FOREIGN_REQUESTS * point.requests:
      self._note(
          'the server holds %d requests, more than the %d this client has '
          'in flight: it counts its share (other clients, or n > 1 '
          'sequences per request)' % (held, point.requests))
    if point.batches and held:
      size = min(held, point.requests)
      self._sizes.append((now, point.batches, size))
      self._held_batches += point.batches
      self._held_requests += size
    queued = point.queued()
    self._recent.append((now, queued, scrape.running))
    warm = scrape.finished is None or (
        scrape.finished > 0 and scrape.finished >= scrape.running)
    if warm and last is not None and self._saturated(last, point):
      ends = [last.served(), point.served()]
      served = [end for end in ends if end is not None]
      if served:
        self._samples.append((now, sum(served) / len(served)))
        self._new_samples = True
        self._measured_at = now
        self._measured_size = self._requests_per_batch()
        self._cache_bound = True
    elif warm and self._queue_saturated(point):
      served_now = point.served()
      if served_now is not None:
        self._samples.append((now, served_now))
        self._new_samples = True
        self._measured_at = now
        self._measured_size = self._requests_per_batch()
        self._cache_bound = False
    elif point.batches and not queued:
      self._note_load(now, point.batches)
      if scrape.cache_usage is not None:
        _note_most(
            self._usage_per_batch, now, scrape.cache_usage / point.batches)

  def value(self, now: float) -> Optional[int]:
    """The value to publish at now: the measured capacity times the target
    utilization, or an estimate, at most the batches the worker can have in
    flight; None when there is none yet (why_none says why)."""
    _check_now(now)
    changed = self._expire(now) or self._new_samples
    self._new_samples = False
    if changed and self._samples:
      median = statistics.median(s for _, s in self._samples)
      if (self._capacity is None or
          abs(median - self._capacity) > _STABILITY * self._capacity):
        self._capacity = median
      self._measured = self._capacity
    elif (self._capacity is not None and
          now - self._measured_at > self._config.hold_secs and
          self._room_grew(self._capacity)):
      self._note(
          'no saturated scrape for %s s: it estimates the capacity again '
          'until it measures' % self._config.hold_secs)
      self._capacity = None
    if self._capacity is not None:
      value: Optional[float] = (
          self._capacity * self._config.target_utilization)
    else:
      value = self._estimate(now)
    if value is None:
      return None
    max_batches_in_flight = self._config.max_batches_in_flight
    if max_batches_in_flight is not None:
      value = min(value, max_batches_in_flight)
    self._answered, self._why = True, None
    return max(1, int(value + 0.5))

  def _note(self, note: str) -> None:
    if note not in self._notes:
      self._notes.append(note)

  def _expire(self, now: float) -> bool:
    """Forgets the samples older than the window, the loads, sizes and
    durations older than the hold, and the batches taken as lost;
    returns whether a sample expired."""
    changed = False
    cutoff = now - self._config.window_secs
    while self._samples and self._samples[0][0] < cutoff:
      self._samples.popleft()
      changed = True
    cutoff = now - self._config.hold_secs
    while self._loads and self._loads[0][0] < cutoff:
      self._loads.popleft()
    while self._usage_per_batch and self._usage_per_batch[0][0] < cutoff:
      self._usage_per_batch.popleft()
    while self._sizes and self._sizes[0][0] < cutoff:
      _, batches, held = self._sizes.popleft()
      self._held_batches -= batches
      self._held_requests -= held
    while self._durations and self._durations[0][0] < cutoff:
      self._durations.popleft()
    while self._lost and next(iter(self._lost.values()))[0] < cutoff:
      del self._lost[next(iter(self._lost))]
    cutoff = now - self._config.saturated_queue_secs
    while len(self._recent) > 1 and self._recent[0][0] < cutoff:
      self._recent.popleft()
    # With no batch finished over the hold, one in flight for all of it is
    # lost too.
    limit = self._config.hold_secs
    if self._durations:
      limit = max(_MIN_EXPIRY_SECS, _EXPIRY_FACTOR * self._durations[0][1])
    # Batches taken as lost under a lower limit, which a batch that finished
    # since has raised, are in flight again: the youngest lost.
    back = list(
        itertools.takewhile(
            lambda item: now - item[1][0] <= limit,
            reversed(self._lost.items())))
    if back:
      for batch, record in back:
        del self._lost[batch]
        self._in_flight[batch] = record
        self._requests_in_flight += record[1]
      self._in_flight = dict(sorted(self._in_flight.items()))
    if self._in_flight:
      # The batches in flight, oldest first.
      lost = list(
          itertools.takewhile(
              lambda item: now - item[1][0] > limit, self._in_flight.items()))
      for batch, record in lost:
        del self._in_flight[batch]
        self._requests_in_flight -= record[1]
        self._lost[batch] = record
      if lost:
        self._note(
            '%d batch(es) in flight for more than %d s are taken as lost' %
            (len(lost), limit))
    return changed

  def _queue_saturated(self, point: _Point) -> bool:
    """Whether the server queued at point, at half the scrapes of the last
    saturated_queue_secs and in both halves of that span, with a steady
    running count."""
    span = self._config.saturated_queue_secs
    if not point.queued() or point.time - self._first_scrape < span:
      return False
    recent = [r for r in self._recent if r[0] >= point.time - span]
    queued = [r for r in recent if r[1]]
    if len(queued) < _QUEUED_SHARE * len(recent):
      return False
    middle = point.time - span / 2
    early = [running for t, _, running in queued if t < middle]
    late = [running for t, _, running in queued if t >= middle]
    return bool(early) and max(late) <= _PLATEAU * min(early)

  def _saturated(self, first: _Point, second: _Point) -> bool:
    """Whether the interval between two scrapes was saturated by the cache
    or preemptions."""
    a, b = first.scrape, second.scrape
    threshold = self._config.saturated_cache_usage
    if (a.cache_usage is not None and b.cache_usage is not None and
        min(a.cache_usage, b.cache_usage) >= threshold):
      return True
    return (
        a.preemptions is not None and b.preemptions is not None and
        b.preemptions > a.preemptions)

  def _note_load(self, now: float, batches: int) -> None:
    """Notes that the server served batches without queueing."""
    if not self._loads or batches > self._loads[0][1]:
      self._load_rose_at = now
    _note_most(self._loads, now, batches)

  def _room_grew(self, capacity: float) -> bool:
    """Whether what the hold saw says the capacity grew past 1.25 times
    the one measured: the server served that many batches without queueing;
    or a capacity a queue bounded came from batches of 1.25 times as many
    requests as the server now holds per batch in flight; or a capacity its
    full cache bounded would now fit 1.25 times below
    config.saturated_cache_usage, at the most cache its scrapes without a
    queue held per batch in flight, and its prior, when known, allows it."""
    grown = _OUTGROWN * capacity
    if self._loads and self._loads[0][1] >= grown:
      return True
    if not self._cache_bound:
      # An idle hold held no batch: it shows no room (the sizes sent before
      # the measurement say nothing of the hold).
      if not self._held_batches:
        return False
      size = self._held_requests / self._held_batches
      return bool(
          size and self._measured_size and
          self._measured_size >= _OUTGROWN * size)
    if not self._usage_per_batch:
      return False
    prior = self._prior()
    return (prior is None or prior >= grown) and (
        self._usage_per_batch[0][1] * grown
        < self._config.saturated_cache_usage)

  def _requests_per_batch(self) -> float:
    """The requests the server held per batch in flight over the hold, or
    those sent per batch before it held any; 0 before any was sent."""
    if self._held_batches:
      return self._held_requests / self._held_batches
    batches, requests = self._batches_sent, self._requests_sent
    return requests / batches if batches else 0

  def _prior(self) -> Optional[float]:
    """The most batches the server can serve at once by its configuration:
    max_running_requests over the requests it holds per batch in flight."""
    limit = self._config.max_running_requests
    if limit is None:
      return None
    size = self._requests_per_batch()
    return limit / size if size > 0 else None

  def _estimate(self, now: float) -> Optional[float]:
    """The capacity while none is measured, or None: from the most batches
    served without queueing toward the prior, and from 1.25 to 2 times what
    was measured last (the rules are in the class docstring)."""
    if not self._loads:
      self._why = (
          'no batches in flight'
          if not self._in_flight else 'no scrape with batches in flight that '
          'did not queue yet')
      return None
    load = self._loads[0][1]
    if not self._answered and now - self._load_rose_at < (
        self._config.settle_secs):
      self._why = (
          'the load is still growing (to %d batches in flight); it answers '
          'once it has not grown for %s s' % (load, self._config.settle_secs))
      return None
    prior = self._prior()
    if prior is None:
      value = _PROBE_WITHOUT_PRIOR * load
    else:
      value = _PROBE * load
      if load * _FAR_BELOW < prior:
        value = max(value, math.sqrt(load * prior))
      value = min(prior, value)
    if self._measured is not None:
      # Above what it measured, to probe for more, and at most twice it.
      value = min(max(value, _OUTGROWN * self._measured), 2 * self._measured)
    return value


def _note_most(most: collections.deque, now: float, value: float) -> None:
  """Appends (now, value) to a deque of (time, value) kept so that each
  value is more than any after it: its first is the most since its first
  time."""
  while most and most[-1][1] <= value:
    most.pop()
  most.append((now, value))


def _check_scrape(scrape: ServerScrape) -> None:
  """Checks that the counts of a scrape are finite and not negative, and
  its cache usage finite."""
  for name, value in zip(ServerScrape._fields, scrape):
    if value is None and name not in ('running', 'waiting'):
      continue
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or
        not math.isfinite(value)):
      raise ValueError(f'scrape.{name} must be a finite number, got {value!r}.')
    if value < 0 and name != 'cache_usage':
      raise ValueError(f'scrape.{name} must be at least 0, got {value!r}.')


def _check_now(now: Any) -> None:
  """Raises unless now is a finite number: after an infinite or NaN time,
  every later scrape would look older than the last."""
  if (isinstance(now, bool) or not isinstance(now, (int, float)) or
      not math.isfinite(now)):
    raise ValueError(f'now must be a finite number of seconds, got {now!r}.')


def _check_batch(num_requests: Any) -> None:
  if isinstance(num_requests, bool) or not isinstance(num_requests, int):
    raise TypeError(f'num_requests must be an int, got {num_requests!r}.')
  if num_requests < 0:
    raise ValueError(
        f'num_requests must not be negative, got {num_requests!r}.')


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
      name, rest = line[:brace], line[_labels_end(line, brace):]
    else:
      name, _, rest = line.partition(' ')
    # An OpenMetrics exemplar follows ' # ' after the value and timestamp.
    fields = rest.partition(' # ')[0].split()
    if not 1 <= len(fields) <= 2:
      raise ValueError(f'Not a sample: {line[:100]!r}')
    values[name].append(float(fields[0]))
  return values


def _labels_end(line: str, brace: int) -> int:
  """The index just after the '}' that closes the labels opened at brace. A
  label value is quoted and may hold braces, spaces and escaped quotes.
  Raises ValueError if the labels are not closed."""
  quoted = escaped = False
  for i in range(brace + 1, len(line)):
    char = line[i]
    if escaped:
      escaped = False
    elif char == '\\':
      escaped = quoted
    elif char == '"':
      quoted = not quoted
    elif char == '}' and not quoted:
      return i + 1
  raise ValueError(f'Not a sample: {line[:100]!r}')


# The lock of each estimator a publisher feeds.
_ESTIMATOR_LOCKS: 'weakref.WeakKeyDictionary' = weakref.WeakKeyDictionary()
_ESTIMATOR_LOCKS_LOCK = threading.Lock()
# The publisher that started last under each tag in this process.
_PUBLISHERS: 'weakref.WeakValueDictionary' = weakref.WeakValueDictionary()
_PUBLISHERS_LOCK = threading.Lock()


class PrometheusNumLoadedModelsPublisher:
  """Publishes how many batches an inference server can serve at once.

  A thin loop around a CapacityEstimator: a background thread scrapes the
  server's Prometheus metrics at ``metrics_url`` every
  ``config.poll_interval_secs``, tells the estimator what it read, and
  publishes the estimator's value to the process-wide distribution
  ``num_loaded_models_<tag>`` in the namespace ``BeamML_ModelManager``,
  where RunInference's model manager publishes how many models a worker has
  loaded, at every poll (see the module docstring for the statistic a
  runner should read). The client tells it the batches it sends
  (``batch_started``, ``batch_finished``).

  A scrape that fails (unreachable server, an HTTP error, a page larger
  than 2 MiB or slower than a poll interval, 1 to 4 s, in all, text that
  does not parse, a metric that is missing, not finite or negative) is
  logged and tells the estimator nothing: polling goes on and the
  estimator's value is published again. So is a poll that has nothing to
  publish, with the reason. A
  counter that goes down was reset; when the count of finished requests
  goes down, the server restarted at the same URL, and no interval spans
  the restart. ``set_metrics_url`` points the
  publisher at a restarted server and keeps what it measured. ``stop()``
  publishes 0 and ends the thread within 2 seconds, whatever the server
  does; so does the collection of ``owner``, without waiting. A scrape that
  fails once ``alive`` says the server has exited ends the thread without
  publishing 0, since a restarted server's publisher may take over the
  estimator, unless ``set_metrics_url`` was called meanwhile; once the
  thread ends, ``set_metrics_url`` refuses a new URL. In a process, only
  the publisher that started last under a tag publishes: starting one
  ends any other under its tag (``replaced``),
  which publishes no value more, not even 0 (its last scrape still counts
  its server's counters). A model that RunInference's side input updates
  gets a new server, and the old one may still run.

  Args:
    metrics_url: the server's Prometheus text endpoint, an http:// URL
      such as ``http://localhost:8000/metrics`` (with ``fetch``, any str
      it reads).
    tag: the model tag RunInference knows the model by (see
      ModelHandler.set_model_identifier).
    metric_names: a ServerMetricNames: the names of the server's metrics.
    config: an AutoscalingConfig; when None, the estimator's if one is
      given, else the defaults.
    counters: optional. Server counters to republish, a mapping from the
      scraped sample name (e.g. ``vllm:prefix_cache_hits_total``) to a Beam
      counter name. Each scrape adds their increases to process-wide Beam
      counters in ``counters_namespace``; the first scrape of a server adds
      their values since it started, and so does a reset.
    counters_namespace: the namespace of those counters; required with them.
    former_names: optional. A mapping from the name of a metric read (in
      metric_names or counters) to the name an older release of the server
      gave it. A page without a sample under the current name is read under
      the former one, so that the publisher works with servers from before
      a rename; a page that has both is read under the current name. The
      choice is made per metric: a page with some series under each name
      is read under the current name alone.
    owner: optional. An object whose collection stops the publisher. The
      publisher holds only a weak reference to it.
    alive: optional. Says whether the server still runs; a scrape that fails
      when it says False ends the polling thread.
    estimator: optional. The CapacityEstimator to feed, e.g. that of a
      publisher of the same server that stopped; a new one by default.
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
      former_names: Optional[Mapping[str, str]] = None,
      owner: Optional[object] = None,
      alive: Optional[Callable[[], bool]] = None,
      estimator: Optional[CapacityEstimator] = None,
      clock: Callable[[], float] = time.monotonic,
      fetch: Optional[Callable[[str], str]] = None):
    for name, fn in (('alive', alive), ('clock', clock), ('fetch', fetch)):
      if fn is not None and not callable(fn):
        raise TypeError(f'{name} must be callable, got {fn!r}.')
    self._check_url = _check_name if fetch else _check_http_url
    self._check_url('metrics_url', metrics_url)
    _check_name('tag', tag)
    if not isinstance(metric_names, ServerMetricNames):
      raise TypeError(
          f'metric_names must be a ServerMetricNames, got {metric_names!r}.')
    if estimator is not None and not isinstance(estimator, CapacityEstimator):
      raise TypeError(
          f'estimator must be a CapacityEstimator, got {estimator!r}.')
    if config is None:
      config = estimator.config if estimator else AutoscalingConfig()
    if not isinstance(config, AutoscalingConfig):
      raise TypeError(f'config must be an AutoscalingConfig, got {config!r}.')
    if estimator is not None and config != estimator.config:
      # The publisher would poll by one and the estimator measure by the
      # other.
      raise ValueError(
          f'config must be the estimator\'s config, {estimator.config!r}, '
          f'got {config!r}.')
    if counters is None:
      counters = {}
    if not isinstance(counters, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in counters.items()):
      raise TypeError(
          f'counters must be a mapping from str to str, got {counters!r}.')
    if counters:
      _check_name('counters_namespace', counters_namespace)
    if former_names is None:
      former_names = {}
    if not isinstance(former_names, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str)
        for k, v in former_names.items()):
      raise TypeError(
          'former_names must be a mapping from str to str, got '
          f'{former_names!r}.')
    self._former_names = dict(former_names)
    self._url = metrics_url
    self._scraped_url = metrics_url
    self._tag = tag
    self._names = metric_names
    self._config = config
    self._estimator = estimator or CapacityEstimator(config)
    # Guards the estimator, which the client's threads tell their batches;
    # shared with the publisher it took the estimator from, which a client
    # thread may still be telling.
    with _ESTIMATOR_LOCKS_LOCK:
      self._lock = _ESTIMATOR_LOCKS.setdefault(
          self._estimator, threading.Lock())
    if estimator is not None:
      with self._lock:
        # What it measured is kept; the server it scrapes is new.
        estimator.server_restarted()
    self._alive = alive
    self._clock = clock
    self._fetch = fetch or self._http_get
    self._timeout = min(config.poll_interval_secs, _MAX_SOCKET_TIMEOUT_SECS)
    self._scrape_limit = min(
        max(config.poll_interval_secs, _MIN_SCRAPE_SECS), _MAX_SCRAPE_SECS)
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
    formers = list(former_names.values())
    for name, former in former_names.items():
      if name not in wanted or former in wanted or formers.count(former) > 1:
        raise ValueError(
            'former_names must map names of metrics the publisher reads to '
            f'distinct names it does not read, got {name!r}: {former!r}.')
    wanted += [former_names[name] for name in wanted if name in former_names]
    # Only the lines of these metrics are parsed.
    self._line_prefixes = tuple(
        name + end for name in wanted for end in ('{', ' '))
    self._counter_values: dict[str, float] = {}
    # The server's count of finished requests at the last scrape.
    self._finished: Optional[float] = None
    # The socket of the scrape in progress, which stop() may cut.
    self._socket: Optional[socket.socket] = None
    self._aborted = False
    self._replaced = False
    # Set when the thread ends because its server exited.
    self._ended = False
    # How many times set_metrics_url gave a URL, the same one included.
    self._urls_set = 0
    self._problem: Optional[str] = None
    self._why: Optional[str] = None
    self._value: Optional[int] = None
    self._stopping = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self._finalizer = (
        weakref.finalize(owner, self._stopping.set)
        if owner is not None else None)

  @property
  def estimator(self) -> CapacityEstimator:
    """The estimator it feeds, which a publisher that replaces it may take
    over."""
    return self._estimator

  @property
  def value(self) -> Optional[int]:
    """The value published last, or None before the first."""
    return self._value

  @property
  def replaced(self) -> bool:
    """Whether a publisher that started under its tag ended this one."""
    with self._lock:
      return self._replaced

  @property
  def running(self) -> bool:
    """Whether the polling thread runs."""
    return self._thread is not None and self._thread.is_alive()

  def batch_started(self, num_requests: int) -> int:
    """Notes that a batch of num_requests requests was sent to the server;
    returns its id for batch_finished."""
    _check_batch(num_requests)
    with self._lock:
      return self._estimator.batch_started(self._clock(), num_requests)

  def batch_finished(self, batch: int) -> None:
    """Notes that the batch batch_started answered got all its responses,
    or failed."""
    with self._lock:
      self._estimator.batch_finished(self._clock(), batch)

  def set_metrics_url(self, metrics_url: str) -> bool:
    """Points the publisher at a restarted server. What it measured is kept;
    the new server's counters count from its start.

    Returns:
      False, changing nothing, once the thread has ended or is ending (its
      server exited, or it was stopped): a new publisher must take over then.
    """
    self._check_url('metrics_url', metrics_url)
    with self._lock:
      if self._ended or self._stopping.is_set():
        return False
      self._url = metrics_url
      self._urls_set += 1
      return True

  def start(self) -> None:
    """Starts the polling thread; a publisher starts once."""
    with self._lock:
      if self._thread is not None:
        raise RuntimeError('The publisher was already started.')
      self._thread = threading.Thread(
          target=self._run,
          name=f'PrometheusNumLoadedModelsPublisher-{self._tag}',
          daemon=True)
    # Started first: a publisher whose thread cannot start ends no other.
    self._thread.start()
    with _PUBLISHERS_LOCK:
      replaced = _PUBLISHERS.get(self._tag)
      _PUBLISHERS[self._tag] = self
    if replaced is not None:
      replaced._make_way()

  def _make_way(self) -> None:
    """Ends the polling thread, without waiting, for a publisher that
    started under the same tag; nothing is published from then on."""
    with self._lock:
      self._replaced = True
    if self.running:
      _LOGGER.info(
          'Publisher %s of %s stops: another started under its tag.',
          self._tag,
          self._url)
    self._stopping.set()
    if self._finalizer is not None:
      self._finalizer.detach()

  def stop(self) -> None:
    """Stops the polling thread: it scrapes a last time for the counters,
    publishes 0 (unless another publisher started under its tag) and ends.
    Returns within 2 seconds, with the thread ended unless called from the
    thread itself. A thread that already ended when its server exited left
    its value to a publisher of the restarted server: stopped, it has none,
    and 0 is published then too."""
    self._stopping.set()
    if self._finalizer is not None:
      self._finalizer.detach()
    with self._lock:
      ended = self._ended
    if ended:
      self._publish(0)
      return
    thread = self._thread
    # A thread that never started (start() failed) has no ident.
    if (thread is None or thread.ident is None or
        thread is threading.current_thread() or sys.is_finalizing()):
      return
    thread.join(_STOP_GRACE_SECS)
    if thread.is_alive():
      # The server is slow to answer: cut the connection the thread waits on.
      with self._lock:
        self._aborted = True
      self._cut()
      thread.join(_STOP_JOIN_SECS)

  def _cut(self) -> None:
    """Cuts the connection of the scrape in progress, if any."""
    with self._lock:
      sock = self._socket
    if sock is not None:
      try:
        sock.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass

  def _run(self) -> None:
    while True:
      with self._lock:
        urls_set = self._urls_set
      exited = False
      try:
        exited = not self._poll()
      except Exception:  # pylint: disable=broad-except
        _LOGGER.exception('Publisher %s failed to poll.', self._tag)
      if exited:
        if self._stopping.is_set():
          break
        with self._lock:
          if self._urls_set != urls_set:
            # The server restarted while this poll failed (at the same URL,
            # maybe): poll the new one.
            continue
          self._ended = True
        # Not 0: a restarted server's publisher takes over the estimator
        # and its value.
        _LOGGER.info('Publisher %s stops: its server has exited.', self._tag)
        return
      elif self._stopping.wait(self._config.poll_interval_secs):
        try:
          # Counter increases since the last poll, e.g. of the last batches.
          self._scrape()
        except Exception:  # pylint: disable=broad-except
          _LOGGER.exception('Publisher %s failed to poll.', self._tag)
        break
    # Its owner stopped the server: nothing takes the value over.
    self._publish(0)

  def _poll(self) -> bool:
    """Scrapes the server once and publishes the current value; returns
    False when the scrape failed and the server has exited."""
    scraped = self._scrape()
    if not scraped and self._alive is not None and not self._alive():
      return False
    with self._lock:
      estimator = self._estimator
      value = estimator.value(self._clock())
      notes = estimator.pop_notes()
      why = estimator.why_none
    for note in notes:
      _LOGGER.info('Publisher %s: %s.', self._tag, note)
    if why != self._why and why is not None:
      _LOGGER.info('Publisher %s has nothing to publish: %s.', self._tag, why)
    self._why = why
    if value is not None:
      self._publish(value)
    return True

  def _http_get(self, url: str) -> str:
    """GETs url with a bounded page size, time in all, and socket
    operations that stop() can cut, connecting included."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path or '/'
    if parts.query:
      path += '?' + parts.query
    host = parts.hostname or 'localhost'
    connection = http.client.HTTPConnection(
        host, parts.port, timeout=self._timeout)
    # A server that trickles its headers or page is cut at the limit.
    timer = threading.Timer(self._scrape_limit, self._cut)
    timer.daemon = True
    started = time.monotonic()
    timer.start()
    try:
      connection.sock = self._connect(host, parts.port or 80)
      connection.request('GET', path)
      response = connection.getresponse()
      if response.status != 200:
        raise IOError(f'HTTP status {response.status} {response.reason}')
      chunks, size = [], 0
      while True:
        chunk = response.read1(1 << 16)
        if not chunk:
          break
        size += len(chunk)
        if size > _MAX_PAGE_BYTES:
          raise ValueError(f'the page is larger than {_MAX_PAGE_BYTES} bytes')
        chunks.append(chunk)
    except (OSError, http.client.HTTPException) as e:
      if time.monotonic() - started >= self._scrape_limit:
        raise TimeoutError(
            f'the scrape took longer than {self._scrape_limit} s') from e
      raise
    finally:
      timer.cancel()
      with self._lock:
        self._socket = None
      connection.close()
    if time.monotonic() - started >= self._scrape_limit:
      raise TimeoutError(f'the scrape took longer than {self._scrape_limit} s')
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

  def _scrape(self) -> bool:
    """Fetches and reads the server's metrics and tells the estimator;
    returns whether it could."""
    with self._lock:
      url = self._url
    try:
      text = self._fetch(url)
      values = _read_samples(text, self._line_prefixes)
    except Exception as e:  # pylint: disable=broad-except
      self._report(f'cannot read {url}: {e!r}')
      return False
    for name, former in self._former_names.items():
      if name not in values and former in values:
        values[name] = values[former]
    with self._lock:
      if url != self._url:
        return False
      finished = (
          _total(values.get(self._names.finished))
          if self._names.finished else None)
      restarted = url != self._scraped_url or (
          finished is not None and self._finished is not None and
          finished < self._finished)
      self._scraped_url = url
      self._finished = finished
      if restarted:
        # A new server: nothing spans the restart, its counters start at 0.
        self._estimator.server_restarted()
        self._counter_values = {}
    self._read_counters(values)
    scrape, problem = self._read_scrape(values)
    if scrape is not None:
      with self._lock:
        self._estimator.observe(self._clock(), scrape)
    self._report(f'{url}: {problem}' if problem else None)
    return scrape is not None

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

  def _read_scrape(
      self, values: Mapping[str, list[float]]
  ) -> tuple[Optional[ServerScrape], Optional[str]]:
    """The scrape the samples make, or None, and what is wrong with them."""
    names = self._names
    running = _total(values.get(names.running))
    waiting = _total(values.get(names.waiting))
    if running is None or waiting is None:
      bad = [
          name for name, value in ((names.running, running),
                                   (names.waiting, waiting)) if value is None
      ]
      return None, f'no finite, non-negative {" or ".join(bad)}'
    cache_usage = preemptions = finished = None
    if names.cache_usage:
      usage = values.get(names.cache_usage)
      cache_usage = max(usage) if usage and _total(usage) is not None else None
    if names.preemptions:
      preemptions = _total(values.get(names.preemptions))
    problem = None
    if names.finished:
      finished = _total(values.get(names.finished))
      if finished is None:
        problem = (
            f'no finite, non-negative {names.finished}: it measures without '
            'waiting for the server to finish as many requests as it runs')
    return ServerScrape(
        running, waiting, cache_usage, preemptions, finished), problem

  def _publish(self, value: int) -> None:
    with self._lock:
      # Under the lock, so that nothing is published once _make_way returns.
      if self._replaced:
        return
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


def _total(values: Optional[list[float]]) -> Optional[float]:
  """The sum of a metric's samples; None when it has none, or one that is not
  finite or is negative."""
  if not values:
    return None
  total = sum(values) if len(values) > 1 else values[0]
  if not math.isfinite(total) or min(values) < 0:
    return None
  return total
