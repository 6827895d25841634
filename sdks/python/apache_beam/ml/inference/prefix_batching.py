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

"""Prefix-aware batching for LLM model handlers.

LLM servers keep a prefix (KV) cache, which is reused only when requests
that share a prompt prefix reach the same server together. A ModelHandler
built with ``batch_key_fn`` keys each request by its prefix, and
BatchElements batches the requests that share a key on one worker. This
module gives the key functions for prompts (:class:`PromptPrefixKeyFn`) and
chat conversations (:class:`ChatPrefixKeyFn`), and
:class:`PrefixBatchingConfig`, which LLM model handlers take.
"""

# pytype: skip-file

import dataclasses
import numbers
import reprlib
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import Optional
from typing import Union

from apache_beam.transforms.util import AdaptiveNumShards
from apache_beam.transforms.util import BatchElements
from apache_beam.transforms.util import _check_key_fn_not_a_class

__all__ = [
    'DEFAULT_PREFIX_CHAR_LEN',
    'ChatPrefixKeyFn',
    'PrefixBatchingConfig',
    'PromptPrefixKeyFn',
]

# The default length, in characters, of the prefix that keys a prompt: about
# 64 tokens of English, enough to tell most templates apart and short enough
# to end before the part of a prompt that differs per request.
DEFAULT_PREFIX_CHAR_LEN = 256

_ShardSpec = Union[int,
                   Mapping[Any, int],
                   Callable[[Any], int],
                   AdaptiveNumShards]


def _identity(element):
  return element


# Sequences that cannot be a chat's messages or a message's content parts:
# their items are characters or ints.
_NOT_SEQUENCES = (str, bytes, bytearray)

# Shortens the values that error messages about elements show.
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 60


def _shown(value: Any) -> str:
  """A bad value of an element, shortened, and its type, for an error
  message."""
  return f'{_SHORT_REPR.repr(value)} of type {type(value).__name__}'


def _check_prefix_char_len(prefix_char_len, key_fn_class=None):
  if (isinstance(prefix_char_len, bool) or
      not isinstance(prefix_char_len, numbers.Integral)):
    hint = ''
    if key_fn_class is not None and not isinstance(prefix_char_len,
                                                   numbers.Number):
      # The class itself was likely given as a key function, and called
      # with an element.
      hint = (
          f' If {key_fn_class} was given as a key function, pass an '
          f'instance, {key_fn_class}(), not the class: it takes its '
          'settings, not an element.')
    raise TypeError(
        f'prefix_char_len must be a positive int, got {prefix_char_len!r}.'
        f'{hint}')
  if prefix_char_len < 1:
    raise ValueError(
        f'prefix_char_len must be a positive int, got {prefix_char_len!r}.')


def _check_delimiters(delimiters, name='delimiters'):
  if isinstance(delimiters, str) or not isinstance(delimiters, Sequence):
    raise TypeError(
        f'{name} must be a sequence of strings such as (\'\\n\\n\',), got '
        f'{delimiters!r}.')
  for delimiter in delimiters:
    if not isinstance(delimiter, str):
      raise TypeError(
          f'{name} must hold strings, got {delimiter!r} in {delimiters!r}.')
    if not delimiter:
      raise ValueError(
          f'{name} must hold non-empty strings, got {delimiter!r} in '
          f'{delimiters!r}.')


class _PrefixKeyFn:
  """Cuts text to its key: the first prefix_char_len characters, or what
  comes before the earliest delimiter when that is sooner. Only the first
  prefix_char_len characters (plus a delimiter's length) are ever read.
  """
  DEFAULT_DELIMITERS: tuple[str, ...] = ()

  def __init__(
      self,
      prefix_char_len: int = DEFAULT_PREFIX_CHAR_LEN,
      delimiters: Optional[Sequence[str]] = None):
    if delimiters is None:
      delimiters = self.DEFAULT_DELIMITERS
    _check_prefix_char_len(prefix_char_len, type(self).__name__)
    _check_delimiters(delimiters)
    # A numpy integer counts as its int.
    prefix_char_len = int(prefix_char_len)
    self.prefix_char_len = prefix_char_len
    self.delimiters = tuple(delimiters)
    # A delimiter that starts before the cut may end after it.
    longest = max((len(d) for d in self.delimiters), default=1)
    self._window = prefix_char_len + longest - 1

  def _cut(self, text: str) -> str:
    # str's own slice: a str subclass's could give a key of its type, which
    # has no deterministic encoding of its own.
    head = str.__getitem__(text, slice(self._window))
    # Whitespace and delimiters that open the text end no shared part: the
    # key runs to the first delimiter after them, so that it is never empty,
    # nor only whitespace and delimiters that unrelated texts open with too.
    start = 0
    skipped = True
    while skipped:
      skipped = False
      while start < len(head) and head[start].isspace():
        start += 1
      for delimiter in self.delimiters:
        if head.startswith(delimiter, start):
          start += len(delimiter)
          skipped = True
    cut = self.prefix_char_len
    for delimiter in self.delimiters:
      at = head.find(delimiter, start)
      if 0 < at < cut:
        cut = at
    return head[:cut]

  def __repr__(self):
    return (
        f'{type(self).__name__}(prefix_char_len={self.prefix_char_len}, '
        f'delimiters={self.delimiters!r})')


class PromptPrefixKeyFn(_PrefixKeyFn):
  """Keys a prompt string by its prefix, for prefix-aware batching.

  The key is the prompt's first ``prefix_char_len`` characters, or
  everything before the earliest of ``delimiters`` when that comes sooner, so
  that prompts built from one template (instructions, a blank line, then the
  request) share a key. The cost does not depend on the prompt's length: only
  its first ``prefix_char_len`` characters (plus a delimiter's length) are
  read, so an 8 MB prompt costs what a 1 KB one does.

  Args:
    prefix_char_len: the longest key, in characters. Defaults to
      DEFAULT_PREFIX_CHAR_LEN.
    delimiters: strings that end the shared part of a prompt. Defaults to
      ``('\\n\\n',)``, a blank line (prompts with Windows line ends need
      ``'\\r\\n\\r\\n'``); ``()`` keys by length alone. Whitespace and
      delimiters at the very start of a prompt are skipped: the key runs to
      the first delimiter after them. A template whose fixed header ends in
      a blank line gives every prompt one key: Llama 3's chat template puts
      one after its first role header, so prompts rendered with it need the
      end of the shared part instead, such as ``('<|eot_id|>',)``, which
      ends its system turn.
  """
  DEFAULT_DELIMITERS = ('\n\n', )

  def __call__(self, prompt: str) -> str:
    if not isinstance(prompt, str):
      raise TypeError(
          f'PromptPrefixKeyFn keys str prompts, got {_shown(prompt)}.')
    return self._cut(prompt)


class ChatPrefixKeyFn(_PrefixKeyFn):
  """Keys an OpenAI-style chat conversation by its first message.

  A conversation is a sequence of messages, each either a dict with ``role``
  and ``content`` keys or an object with ``role`` and ``content`` attributes
  (such as ``vllm_inference.OpenAIChatMessage``). Its key is the pair of the
  first message's role and the leading text of its content, cut as
  :class:`PromptPrefixKeyFn` cuts a prompt; the first message is usually the
  system prompt that conversations share. ``content`` may be a string, None,
  or a list of OpenAI content parts: text parts count with their text, other
  parts (images, audio) with their type alone, as ``<image_url>``.

  A conversation that is not a sequence, an empty one, or a message or
  content part of an unknown shape raises an error instead of falling back to
  a key that would batch unrelated conversations together.

  Args:
    prefix_char_len: the longest text in a key, in characters. Defaults to
      DEFAULT_PREFIX_CHAR_LEN.
    delimiters: strings that end the shared part of the first message's
      content. Defaults to ``()``: chat templates keep per-request text in
      later messages.
  """
  def __call__(self, messages: Sequence[Any]) -> tuple[str, str]:
    if (isinstance(messages, _NOT_SEQUENCES) or
        not isinstance(messages, Sequence)):
      raise TypeError(
          'ChatPrefixKeyFn keys a sequence of chat messages, got '
          f'{_shown(messages)}.')
    if not messages:
      raise ValueError('ChatPrefixKeyFn cannot key an empty conversation.')
    role, content = self._role_and_content(messages[0])
    return role, self._cut(self._content_text(content))

  @staticmethod
  def _role_and_content(message):
    if isinstance(message, Mapping):
      if 'role' in message and 'content' in message:
        role, content = message['role'], message['content']
      else:
        raise ValueError(
            'ChatPrefixKeyFn needs a "role" and a "content" in a chat '
            f'message, got the keys {sorted(message)}.')
    elif hasattr(message, 'role') and hasattr(message, 'content'):
      role, content = message.role, message.content
    else:
      raise TypeError(
          'ChatPrefixKeyFn needs chat messages with role and content, as '
          f'dicts or attributes, got {_shown(message)}.')
    if not isinstance(role, str):
      raise TypeError(
          f'ChatPrefixKeyFn needs a str role, got {_shown(role)} in a message.')
    # As the plain str it holds: a str Enum or subclass has no deterministic
    # encoding of its own, or one that differs between workers.
    return str.__str__(role), content

  def _content_text(self, content) -> str:
    if content is None or isinstance(content, str):
      return content or ''
    if (isinstance(content, Sequence) and
        not isinstance(content, _NOT_SEQUENCES)):
      pieces, length = [], 0
      for part in content:
        if length >= self._window:
          break
        text = self._part_text(part)
        pieces.append(text)
        length += len(text)
      return ''.join(pieces)
    raise TypeError(
        'ChatPrefixKeyFn needs message content that is a str, None or a '
        f'list of content parts, got {_shown(content)}.')

  def _part_text(self, part) -> str:
    part_type = part.get('type') if isinstance(part, Mapping) else None
    if not isinstance(part_type, str):
      raise TypeError(
          'ChatPrefixKeyFn needs content parts that are dicts with a '
          f'"type", got {_shown(part)}.')
    if part_type == 'text':
      text = part.get('text')
      if not isinstance(text, str):
        raise TypeError(
            f'ChatPrefixKeyFn needs a str "text" in a text part, got '
            f'{_shown(text)}.')
      return text[:self._window]
    return f'<{part_type}>'


def _check_key_fn_instance(key_fn, name):
  """Raises if key_fn is a class whose instances are key functions (one of
  this module's, or another) rather than an instance: the class is
  callable, so it would only fail later, on every element. name names
  key_fn for the message."""
  if isinstance(key_fn, type) and issubclass(key_fn, _PrefixKeyFn):
    raise TypeError(
        f'{name} must be a key function, not the class {key_fn.__name__}: '
        f'pass {key_fn.__name__}(), got {key_fn!r}.')
  _check_key_fn_not_a_class(key_fn, name)


@dataclasses.dataclass(frozen=True)
class PrefixBatchingConfig:
  """How an LLM model handler batches requests by prompt prefix.

  Requests whose prompts share a prefix are routed to the same worker and
  batched together, so that the server's prefix cache is reused. Handlers
  that take this config key requests with their own default extractor (for
  example PromptPrefixKeyFn for completions, ChatPrefixKeyFn for chat)
  unless key_fn is given.

  Args:
    num_shards: how many sub-keys, each batched on its own, a prefix may be
      spread over: an int, a mapping from keys to ints, a callable from a
      key to an int, or an AdaptiveNumShards (see BatchElements'
      num_shards). A mapping is keyed by what the key function returns: the
      prefix text for PromptPrefixKeyFn, a (role, text) pair for
      ChatPrefixKeyFn; unlisted keys get one shard, or a defaultdict's
      default.
      One shard gives the most cache reuse but serves a prefix on one worker
      at a time, which caps a prefix shared by most of the traffic at one
      worker's throughput; more shards spread such a prefix over more
      workers, each of which computes the prefix once. Defaults to
      AdaptiveNumShards(), which measures each prefix's rate: prefixes seen
      less often than about once per buffering period (on bounded input in
      a batch pipeline, fewer than 8 times, or a batch if smaller; not on
      the DirectRunner, which measures bounded input as a stream) share
      batches (a recurring one on the same worker), and busier ones get
      batches of their own, on more shards the busier they are, one shard
      at a time, in runs.
    prefix_char_len: the longest key text, in characters, for the default
      extractor. Defaults to DEFAULT_PREFIX_CHAR_LEN.
    prefix_delimiters: the delimiters of the default extractor, for example
      ``(':',)`` for prompts whose shared instructions end with a colon.
      Defaults to the extractor's own.
    key_fn: a callable mapping a request to its key, replacing the default
      extractor. It should return small values with a deterministic encoding
      (see BatchElements' key_fn).
  """
  num_shards: _ShardSpec = dataclasses.field(default_factory=AdaptiveNumShards)
  prefix_char_len: Optional[int] = None
  prefix_delimiters: Optional[Sequence[str]] = None
  key_fn: Optional[Callable[[Any], Any]] = None

  def __post_init__(self):
    if self.num_shards is None:
      # BatchElements reads None as one shard, which is no default here.
      raise TypeError(
          'num_shards must not be None: 1 gives each prefix one shard.')
    # Fail now, as BatchElements would when the pipeline is expanded.
    BatchElements(key_fn=_identity, num_shards=self.num_shards)
    if self.prefix_char_len is not None:
      _check_prefix_char_len(self.prefix_char_len)
    if self.prefix_delimiters is not None:
      _check_delimiters(self.prefix_delimiters, 'prefix_delimiters')
    if self.key_fn is not None:
      if not callable(self.key_fn):
        raise TypeError(f'key_fn must be callable, got {self.key_fn!r}.')
      _check_key_fn_instance(self.key_fn, 'key_fn')
      if self.prefix_char_len is not None or self.prefix_delimiters is not None:
        raise ValueError(
            'prefix_char_len and prefix_delimiters configure the default '
            'extractor, which key_fn replaces; set either key_fn or them.')

  def resolve(
      self, default_extractor: Callable[..., Callable[[Any], Any]]
  ) -> Callable[[Any], Any]:
    """Returns the key function a handler batches with.

    Args:
      default_extractor: the handler's extractor factory, such as
        PromptPrefixKeyFn; called with prefix_char_len and delimiters=
        unless key_fn is set.
    """
    if isinstance(default_extractor, _PrefixKeyFn):
      cls = type(default_extractor).__name__
      raise TypeError(
          f'default_extractor must be a key function factory such as {cls}, '
          f'not a key function: pass {cls}, got {default_extractor!r}.')
    if self.key_fn is not None:
      return self.key_fn
    return default_extractor(
        DEFAULT_PREFIX_CHAR_LEN
        if self.prefix_char_len is None else self.prefix_char_len,
        delimiters=self.prefix_delimiters)
