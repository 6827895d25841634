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

"""Tests of beampq.project: the pinned base and the project's paths."""

import pytest

from beampq import Error
from beampq import testing
from beampq.project import ROOT
from beampq.project import Base


def test_base_loads_the_pin(tmp_path):
  project = testing.make_project(tmp_path)
  assert project.base.filename == 'apache_beam-9.9.0.tar.gz'
  assert project.base.subdir == 'sdks/python'


@pytest.mark.parametrize(
    'text, message',
    [
        (None, 'is missing'),
        ('[base]\nproject = x\n', "missing 'version' in \\[base\\]"),
        (
            '[base]\nproject = x\nversion = 1\nfilename = x.tar.gz\n'
            'sha256 = abc\nsubdir = sdks/python\n',
            "sha256 'abc' is not 64 hex digits"),
    ])
def test_base_errors(tmp_path, text, message):
  path = tmp_path / 'base.cfg'
  if text is not None:
    path.write_text(text)
  with pytest.raises(Error, match=message):
    Base.load(path)


def test_missing_series_and_description_are_named(tmp_path):
  project = testing.make_project(tmp_path)
  with pytest.raises(Error,
                     match="'nope' has no description: "
                     'patches/pull-requests/nope.md is missing'):
    project.read_description('nope')
  assert project.read_description('fix').title == '[Python] Fix line 5'
  project.series_file.unlink()
  with pytest.raises(Error, match='patches/series is missing'):
    project.read_series()


def test_the_default_project_is_this_repository():
  assert (ROOT / 'patches' / 'base.cfg').is_file()
  assert (ROOT / 'scripts' / 'beampq' / '__main__.py').is_file()
