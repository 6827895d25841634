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

"""Tests for apache_beam.ml.inference.prefix_batching."""

# pytype: skip-file

import dataclasses
import enum
import operator
import unittest

import numpy as np
from parameterized import param
from parameterized import parameterized

from apache_beam.ml.inference import prefix_batching
from apache_beam.ml.inference.prefix_batching import DEFAULT_PREFIX_CHAR_LEN
from apache_beam.ml.inference.prefix_batching import ChatPrefixKeyFn
from apache_beam.ml.inference.prefix_batching import PrefixBatchingConfig
from apache_beam.ml.inference.prefix_batching import PromptPrefixKeyFn
from apache_beam.transforms.util import AdaptiveNumShards

try:
  from apache_beam.ml.inference.vllm_inference import OpenAIChatMessage
except ImportError:
  OpenAIChatMessage = None  # type: ignore[assignment,misc]


class _BadRepr(object):
  """A value whose repr fails."""
  def __repr__(self):
    raise RuntimeError('no repr')


class _NoFullScan(str):
  """A prompt that fails the test if it is searched as a whole."""
  def _searched(self, *unused_args, **unused_kwargs):
    raise AssertionError('the whole prompt was searched')

  find = index = rfind = split = partition = count = _searched
  __contains__ = _searched


@dataclasses.dataclass
class _Message:
  role: str
  content: object


class PromptPrefixKeyFnTest(unittest.TestCase):
  def test_keys_by_the_leading_characters(self):
    self.assertEqual(PromptPrefixKeyFn(5)('abcdefgh'), 'abcde')
    self.assertEqual(PromptPrefixKeyFn(5)('abc'), 'abc')
    self.assertEqual(PromptPrefixKeyFn()('x' * 1000), 'x' * 256)
    self.assertEqual(DEFAULT_PREFIX_CHAR_LEN, 256)

  def test_a_blank_line_ends_the_key_by_default(self):
    key_fn = PromptPrefixKeyFn()
    self.assertEqual(
        key_fn('Translate to French.\n\nHello there'), 'Translate to French.')
    self.assertEqual(
        key_fn('Translate to French.\n\nGood night'), 'Translate to French.')

  def test_delimiters_past_the_length_are_ignored(self):
    self.assertEqual(PromptPrefixKeyFn(4)('abcdefg\n\nh'), 'abcd')

  def test_a_delimiter_may_straddle_the_length(self):
    self.assertEqual(PromptPrefixKeyFn(4)('abc\n\nd'), 'abc')
    self.assertEqual(
        PromptPrefixKeyFn(4, delimiters=('::::', ))('ab::::c'), 'ab')

  def test_earliest_delimiter_wins(self):
    for delimiters in ((':', '\n\n'), ('\n\n', ':')):
      key_fn = PromptPrefixKeyFn(delimiters=delimiters)
      self.assertEqual(key_fn('Pick one: x\n\ny'), 'Pick one')
      self.assertEqual(key_fn('Pick\n\none: x'), 'Pick')

  def test_no_delimiters(self):
    self.assertEqual(
        PromptPrefixKeyFn(6, delimiters=())('ab\n\ncdef'), 'ab\n\ncd')

  def test_a_leading_delimiter_is_ignored(self):
    self.assertEqual(PromptPrefixKeyFn()('\n\nabc\n\nd'), '\n\nabc')

  def test_leading_delimiters_are_skipped_however_many(self):
    # Prompts that open with blank lines keep keys of their own, not the
    # newline that such prompts share.
    key_fn = PromptPrefixKeyFn()
    self.assertEqual(key_fn('\n\n\nTranslate.\n\nx'), '\n\n\nTranslate.')
    self.assertEqual(key_fn('\n\n\n\nSummarize.\n\ny'), '\n\n\n\nSummarize.')
    self.assertEqual(key_fn('\n\n\n\n'), '\n\n\n\n')
    key_fn = PromptPrefixKeyFn(delimiters=(':', '\n\n'))
    self.assertEqual(key_fn(':\n\n: Pick one: x'), ':\n\n: Pick one')
    self.assertEqual(
        ChatPrefixKeyFn(delimiters=('\n\n', ))([{
            'role': 'system', 'content': '\n\n\nBe brief.\n\nDate: today'
        }]), ('system', '\n\n\nBe brief.'))

  def test_leading_whitespace_is_skipped_with_the_delimiters(self):
    # Prompts that open with a line of spaces keep keys of their own, not
    # the space that such prompts share.
    key_fn = PromptPrefixKeyFn()
    self.assertEqual(
        key_fn(' \n\nTranslate.\n\nGood morning'), ' \n\nTranslate.')
    self.assertEqual(key_fn(' \n\nSummarize.\n\nBeam is'), ' \n\nSummarize.')
    self.assertEqual(key_fn('\t \n \n\nPick.\n\nx'), '\t \n \n\nPick.')
    self.assertEqual(key_fn(' \n\n '), ' \n\n ')
    key_fn = PromptPrefixKeyFn(delimiters=(':', ))
    self.assertEqual(key_fn(' : Pick one: x'), ' : Pick one')

  def test_a_leading_delimiter_of_several_characters_is_skipped_whole(self):
    # A delimiter that a prompt opens with is skipped as a whole, not a
    # character at a time: the rest of it does not end the key early.
    key_fn = PromptPrefixKeyFn(delimiters=('---', ))
    self.assertEqual(
        key_fn('---\n---\nBe brief.---What is Beam?'), '---\n---\nBe brief.')
    self.assertEqual(
        key_fn('---\n---\nAnswer in French.---Hi'),
        '---\n---\nAnswer in French.')
    key_fn = PromptPrefixKeyFn(delimiters=('<|eot_id|>', ))
    self.assertEqual(
        key_fn('<|eot_id|><|eot_id|>Be brief.<|eot_id|>Hi'),
        '<|eot_id|><|eot_id|>Be brief.')

  def test_delimiters_are_copied_when_built(self):
    # A list of delimiters changed after the key function is built does not
    # change the keys it gives.
    delimiters = [':']
    key_fn = PromptPrefixKeyFn(delimiters=delimiters)
    delimiters.append(' ')
    self.assertEqual(key_fn.delimiters, (':', ))
    self.assertEqual(key_fn('Pick one: a or b'), 'Pick one')

  def test_search_is_bounded_by_the_prefix(self):
    key_fn = PromptPrefixKeyFn(10)
    huge = _NoFullScan('x' * (8 << 20))
    self.assertEqual(key_fn(huge), 'x' * 10)
    self.assertEqual(key_fn(_NoFullScan('ab\n\n' + 'y' * (8 << 20))), 'ab')

  @parameterized.expand([
      param(b'bytes', r"got b'bytes' of type bytes\.$"),
      param(None, r'got None of type NoneType\.$'),
      param(['a'], r"got \['a'\] of type list\.$"),
      param(['a' * 100], r"got \['a{27}\.\.\.a{28}'\] of type list\.$"),
      # A repr that fails leaves the message as it is.
      param(
          _BadRepr(),
          r'got <_BadRepr instance at 0x[0-9a-f]+> of type '
          r'_BadRepr\.$'),
  ])
  def test_non_str_prompts_are_refused(self, prompt, message):
    with self.assertRaisesRegex(TypeError, message):
      PromptPrefixKeyFn()(prompt)

  @parameterized.expand([
      param({'prefix_char_len': 0}, ValueError, 'prefix_char_len .*got 0'),
      param({'prefix_char_len': True}, TypeError, 'got True'),
      param({'prefix_char_len': '5'}, TypeError, "got '5'"),
      param({'delimiters': '\n\n'}, TypeError, 'sequence of strings'),
      param({'delimiters': ('', )}, ValueError, "got '' in"),
      param({'delimiters': (1, )}, TypeError, 'hold strings, got 1 in'),
      param({'delimiters': (b':', )}, TypeError, "hold strings, got b':' in"),
  ])
  def test_validation(self, kwargs, error, message):
    for key_fn_class in (PromptPrefixKeyFn, ChatPrefixKeyFn):
      with self.assertRaisesRegex(error, message):
        key_fn_class(**kwargs)

  def test_the_class_given_as_a_key_fn_says_so(self):
    # The class is callable, so BatchElements(key_fn=PromptPrefixKeyFn)
    # calls it with each element: the error says what went wrong.
    for key_fn_class, element in ((PromptPrefixKeyFn, 'Translate.\n\nHi'),
                                  (ChatPrefixKeyFn, [{'role': 'user'}])):
      name = key_fn_class.__name__
      with self.assertRaisesRegex(TypeError,
                                  f'pass an instance, {name}\\(\\), not the '
                                  'class'):
        key_fn_class(element)
    # A number is a setting, only of the wrong type.
    with self.assertRaisesRegex(TypeError, r'got 2\.5\.$'):
      PromptPrefixKeyFn(2.5)
    # A length given as a str may be either: the hint says when it applies.
    with self.assertRaisesRegex(TypeError,
                                r"^prefix_char_len must be a positive int, "
                                r"got '256'\. If PromptPrefixKeyFn was given "
                                r"as a key function, pass an instance"):
      PromptPrefixKeyFn('256')

  def test_a_str_subclass_keys_as_plain_text(self):
    class Sliced(str):
      def __getitem__(self, index):
        return Sliced(super().__getitem__(index))

    prompt = Sliced('Be brief.\n\nWhat is Beam?')
    keys = [
        (PromptPrefixKeyFn()(prompt), 'Be brief.'),
        (
            ChatPrefixKeyFn()([dict(role='system', content=prompt)])[1],
            'Be brief.\n\nWhat is Beam?'),
    ]
    for key, expected in keys:
      self.assertEqual(key, expected)
      self.assertIs(type(key), str)

  def test_a_numpy_length_counts_as_its_int(self):
    key_fn = PromptPrefixKeyFn(prefix_char_len=np.int64(4))
    self.assertIs(type(key_fn.prefix_char_len), int)
    self.assertEqual(key_fn('abcdef'), 'abcd')

  def test_a_template_header_that_ends_in_a_blank_line(self):
    # Llama 3's chat template ends its first role header with a blank line:
    # by default, prompts with different system turns share a key; its
    # end-of-turn token tells them apart, as the docstring advises.
    def llama3(system):
      return (
          '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n'
          f'{system}<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi')

    prompts = [llama3('Be brief.'), llama3('Answer in French.')]
    self.assertEqual(len({PromptPrefixKeyFn()(p) for p in prompts}), 1)
    by_turn = PromptPrefixKeyFn(delimiters=('<|eot_id|>', ))
    self.assertEqual(
        by_turn(prompts[0]),
        '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n'
        'Be brief.')
    self.assertEqual(len({by_turn(p) for p in prompts}), 2)

  def test_keys_are_plain_text(self):
    # A key is a plain str cut from the prompt, so its deterministic encoding,
    # by which workers route it, is the same in every process.
    prompts = ['System: be brief.\n\nWhat is Beam?', 'Zusammenfassung: ' * 40]
    for prompt in prompts:
      for key in (PromptPrefixKeyFn()(prompt),
                  ChatPrefixKeyFn()([{'role': 'system',
                                      'content': prompt}])[1]):
        self.assertIs(type(key), str)
        self.assertTrue(prompt.startswith(key))


class ChatPrefixKeyFnTest(unittest.TestCase):
  def test_keys_dict_messages_by_the_first_one(self):
    key_fn = ChatPrefixKeyFn(prefix_char_len=12)
    system = dict(role='system', content='You are a helpful assistant.')
    self.assertEqual(
        key_fn([system, dict(role='user', content='Hi')]),
        ('system', 'You are a he'))
    self.assertEqual(
        key_fn([system, dict(role='user', content='Other')]),
        ('system', 'You are a he'))

  def test_a_str_enum_role_keys_as_its_text(self):
    class Role(str, enum.Enum):
      SYSTEM = 'system'

    class Tagged(str):
      pass

    for role in (Role.SYSTEM, Tagged('system')):
      key = ChatPrefixKeyFn()([dict(role=role, content='Hello')])
      self.assertEqual(key, ('system', 'Hello'))
      self.assertIs(type(key[0]), str)

  def test_role_is_part_of_the_key(self):
    key_fn = ChatPrefixKeyFn()
    self.assertNotEqual(
        key_fn([dict(role='system', content='Hello')]),
        key_fn([dict(role='user', content='Hello')]))

  def test_keys_message_objects(self):
    self.assertEqual(
        ChatPrefixKeyFn(5)([_Message('user', 'abcdefgh')]), ('user', 'abcde'))

  @unittest.skipIf(OpenAIChatMessage is None, 'openai is not installed')
  def test_keys_openai_chat_messages(self):
    conversation = [
        OpenAIChatMessage('system', 'Answer in French.'),
        OpenAIChatMessage('user', 'Hello'),
    ]
    self.assertEqual(
        ChatPrefixKeyFn()(conversation), ('system', 'Answer in French.'))

  def test_content_parts(self):
    parts = [
        dict(type='text', text='Describe'),
        dict(type='image_url', image_url=dict(url='data:image/png;base64,AA')),
        dict(type='text', text=' this.'),
    ]
    conversation = [dict(role='user', content=parts)]
    self.assertEqual(
        ChatPrefixKeyFn()(conversation), ('user', 'Describe<image_url> this.'))
    self.assertEqual(ChatPrefixKeyFn(10)(conversation), ('user', 'Describe<i'))

  def test_content_parts_are_read_only_up_to_the_prefix(self):
    parts = [
        dict(type='text', text='abc'),
        dict(type='text', text='x' * 10),
        'not a part',
    ]
    self.assertEqual(
        ChatPrefixKeyFn(8)([dict(role='user', content=parts)]),
        ('user', 'abcxxxxx'))

  def test_content_parts_past_a_full_prefix_are_not_read(self):
    # Parts that exactly fill the prefix end the reading: the next one is
    # not looked at, even if it is of an unknown shape.
    parts = [
        dict(type='text', text='abcd'),
        dict(type='text', text='efgh'),
        'not a part',
    ]
    self.assertEqual(
        ChatPrefixKeyFn(8)([dict(role='user', content=parts)]),
        ('user', 'abcdefgh'))

  def test_a_message_object_without_content_is_refused(self):
    @dataclasses.dataclass
    class RoleOnly:
      role: str

    with self.assertRaisesRegex(TypeError,
                                'needs chat messages with role and content, '
                                r'as dicts or attributes, got .* of type '
                                r'RoleOnly\.$'):
      ChatPrefixKeyFn()([RoleOnly('system')])

  def test_empty_content(self):
    self.assertEqual(
        ChatPrefixKeyFn()([dict(role='assistant', content=None)]),
        ('assistant', ''))

  def test_delimiters(self):
    rules = [dict(role='system', content='Rules---Today is Monday')]
    self.assertEqual(
        ChatPrefixKeyFn(delimiters=('---', ))(rules), ('system', 'Rules'))
    blank_line = [dict(role='system', content='a\n\nb')]
    self.assertEqual(ChatPrefixKeyFn()(blank_line), ('system', 'a\n\nb'))

  @parameterized.expand([
      param('a str', 'hello', TypeError, "got 'hello' of type str"),
      param(
          'a dict',
          dict(role='user'),
          TypeError,
          "got {'role': 'user'} of type dict"),
      param('None', None, TypeError, 'got None of type NoneType'),
      param('empty', [], ValueError, 'empty conversation'),
      param('no role', [dict(content='x')], ValueError, r"keys \['content'\]"),
      param('no content', [dict(role='x')], ValueError, r"keys \['role'\]"),
      param(
          'a bare str message', ['hello'], TypeError,
          "got 'hello' of type str"),
      param(
          'a tuple message', [('user', 'hi')],
          TypeError,
          r"got \('user', 'hi'\) of type tuple"),
      param(
          'a non-str role', [dict(role=1, content='x')],
          TypeError,
          'str role, got 1 of type int in a message'),
      param(
          'int content', [dict(role='user', content=5)],
          TypeError,
          'got 5 of type int'),
      param(
          'bytes content', [dict(role='user', content=b'hi')],
          TypeError,
          r"a str, None or a list of content parts, got b'hi' of type "
          r"bytes\.$"),
      param(
          'bytearray content', [dict(role='user', content=bytearray(b'hi'))],
          TypeError,
          r"content parts, got bytearray\(b'hi'\) of type bytearray\.$"),
      param(
          'a bytearray conversation',
          bytearray(b'hi'),
          TypeError,
          r"sequence of chat messages, got bytearray\(b'hi'\) of type "
          r"bytearray\.$"),
      param(
          'a part without type', [dict(role='user', content=[dict(text='x')])],
          TypeError,
          r'with a "type", got {\'text\': \'x\'} of type dict\.$'),
      param(
          'a text part without text',
          [dict(role='user', content=[dict(type='text')])],
          TypeError,
          'str "text" in a text part, got None of type NoneType'),
  ])
  def test_unknown_shapes_are_refused(
      self, unused_name, messages, error, message):
    with self.assertRaisesRegex(error, message):
      ChatPrefixKeyFn()(messages)


class PrefixBatchingConfigTest(unittest.TestCase):
  def test_defaults(self):
    key_fn = PrefixBatchingConfig().resolve(PromptPrefixKeyFn)
    self.assertEqual(PrefixBatchingConfig().num_shards, AdaptiveNumShards())
    self.assertIsInstance(key_fn, PromptPrefixKeyFn)
    self.assertEqual(key_fn.prefix_char_len, DEFAULT_PREFIX_CHAR_LEN)
    self.assertEqual(key_fn.delimiters, ('\n\n', ))
    chat_key_fn = PrefixBatchingConfig().resolve(ChatPrefixKeyFn)
    self.assertEqual(chat_key_fn.delimiters, ())

  def test_resolve_calls_the_extractor_with_the_settings(self):
    calls = []

    def extractor(*args, **kwargs):
      calls.append((args, kwargs))
      return len

    config = PrefixBatchingConfig(
        prefix_char_len=32, prefix_delimiters=(':', ))
    self.assertEqual(config.resolve(extractor), len)
    self.assertEqual(calls, [((32, ), {
        'delimiters': (':', )
    })])

  def test_resolve_refuses_a_key_function_for_its_factory(self):
    # The handlers' key_fn arguments take an instance; resolve the class.
    for config in (PrefixBatchingConfig(),
                   PrefixBatchingConfig(key_fn=str.lower)):
      with self.assertRaisesRegex(
          TypeError,
          r'^default_extractor must be a key function factory such as '
          r'PromptPrefixKeyFn, not a key function: pass PromptPrefixKeyFn, '
          r'got PromptPrefixKeyFn\(prefix_char_len=256'):
        config.resolve(PromptPrefixKeyFn())

  def test_overrides_reach_the_extractor(self):
    config = PrefixBatchingConfig(
        num_shards={'Pick one': 2},
        prefix_char_len=20,
        prefix_delimiters=(':', ))
    key_fn = config.resolve(PromptPrefixKeyFn)
    self.assertEqual(key_fn('Pick one: a or b'), 'Pick one')
    self.assertEqual(key_fn('x' * 30), 'x' * 20)

  def test_key_fn_replaces_the_extractor(self):
    def extractor(*unused_args, **unused_kwargs):
      raise AssertionError('the default extractor was used')

    config = PrefixBatchingConfig(num_shards=2, key_fn=str.lower)
    self.assertEqual(config.resolve(extractor), str.lower)

  @parameterized.expand([
      param(
          dict(num_shards=0), ValueError, 'num_shards must be a positive int'),
      param(dict(num_shards=True), TypeError, 'num_shards .*got True'),
      param(dict(num_shards=None), TypeError, 'num_shards must not be None'),
      param(dict(num_shards=dict(a=0)), ValueError, r"num_shards\['a'\]"),
      param(dict(prefix_char_len=0), ValueError, 'prefix_char_len'),
      param(dict(prefix_delimiters=':'), TypeError, 'prefix_delimiters'),
      param(
          dict(key_fn='key'), TypeError, "key_fn must be callable, got 'key'"),
      param(
          dict(key_fn=PromptPrefixKeyFn),
          TypeError,
          r'not the class PromptPrefixKeyFn: pass PromptPrefixKeyFn\(\)'),
      # The class of another key function, whose instances are callable.
      param(
          dict(key_fn=operator.itemgetter),
          TypeError,
          'key_fn must be a key function, not the class itemgetter'),
      param(
          dict(key_fn=len, prefix_delimiters=(':', )),
          ValueError,
          'set either key_fn or them'),
      param(
          dict(key_fn=len, prefix_char_len=5),
          ValueError,
          'set either key_fn or them'),
  ])
  def test_validation(self, kwargs, error, message):
    with self.assertRaisesRegex(error, message):
      PrefixBatchingConfig(**kwargs)

  def test_module_exports(self):
    self.assertEqual(
        sorted(prefix_batching.__all__),
        [
            'ChatPrefixKeyFn',
            'DEFAULT_PREFIX_CHAR_LEN',
            'PrefixBatchingConfig',
            'PromptPrefixKeyFn'
        ])


if __name__ == '__main__':
  unittest.main()
