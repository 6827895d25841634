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

"""Tests of beampq.sdist: finding, downloading and verifying the base, from
a real package index on 127.0.0.1."""

import hashlib
import io
import os
import stat
import tarfile

import pytest

from beampq import Error
from beampq import sdist
from beampq import testing


def test_fetch_downloads_verifies_and_caches(tmp_path, index):
  index.publish('apache_beam-9.9.0.tar.gz', testing.SDIST)
  project = testing.make_project(tmp_path)
  path = sdist.fetch(project)
  assert path.read_bytes() == testing.SDIST
  hits = len(index.hits)
  assert sdist.fetch(project) == path
  assert len(index.hits) == hits, 'a verified cached file is not fetched again'


def test_fetch_leaves_another_fetchs_download_alone(tmp_path, index):
  # Two fetches at once (the harness tests run on two cores) each write a
  # file of their own: this one must neither take over nor remove the
  # other's, which is still being written.
  index.publish('apache_beam-9.9.0.tar.gz', testing.SDIST)
  project = testing.make_project(tmp_path)
  project.cache.mkdir(parents=True)
  other = project.cache / 'apache_beam-9.9.0.tar.gz.part'
  other.write_bytes(b'half a download')
  assert sdist.fetch(project).read_bytes() == testing.SDIST
  assert other.read_bytes() == b'half a download'
  assert sorted(p.name for p in project.cache.iterdir()) == [
      'apache_beam-9.9.0.tar.gz', other.name
  ]


def test_fetch_reads_html_simple_pages(tmp_path, index):
  index.publish('apache_beam-9.9.0.tar.gz', testing.SDIST, html=True)
  assert sdist.fetch(
      testing.make_project(tmp_path)).read_bytes() == testing.SDIST


def test_fetch_refuses_a_corrupted_download(tmp_path, index):
  project = testing.make_project(tmp_path)
  corrupted = testing.SDIST[:-10] + b'0123456789'
  index.publish(
      'apache_beam-9.9.0.tar.gz',
      corrupted,
      listed_sha=hashlib.sha256(testing.SDIST).hexdigest())
  with pytest.raises(Error, match='has sha256 .* not the pinned'):
    sdist.fetch(project)
  assert not list(project.cache.iterdir()), 'nothing is kept'


def test_fetch_refuses_a_file_the_index_lists_with_another_sha(tmp_path, index):
  project = testing.make_project(tmp_path)
  index.publish('apache_beam-9.9.0.tar.gz', b'other')
  with pytest.raises(Error, match='index lists .* not the pinned'):
    sdist.fetch(project)
  assert '/files/apache_beam-9.9.0.tar.gz' not in index.hits


def test_fetch_replaces_a_corrupted_cache(tmp_path, index):
  index.publish('apache_beam-9.9.0.tar.gz', testing.SDIST)
  project = testing.make_project(tmp_path)
  project.cache.mkdir(parents=True)
  (project.cache / 'apache_beam-9.9.0.tar.gz').write_bytes(b'garbage')
  assert sdist.fetch(project).read_bytes() == testing.SDIST
  # Moved aside, not deleted: the pin, not the file, may be what is wrong.
  aside = [p.name for p in project.cache.glob('*.sha256-*')]
  assert aside == [
      'apache_beam-9.9.0.tar.gz.sha256-' +
      sdist.sha256_of(project.cache / aside[0])[:12]
  ]
  assert (project.cache / aside[0]).read_bytes() == b'garbage'
  # A verified file is readable by all, as the release is.
  assert stat.S_IMODE(
      (project.cache / 'apache_beam-9.9.0.tar.gz').stat().st_mode) == 0o644


def test_fetch_reports_an_unreachable_index(tmp_path, monkeypatch):
  monkeypatch.setenv('PIP_INDEX_URL', 'http://127.0.0.1:9/simple/')
  with pytest.raises(Error, match='cannot read the package index'):
    sdist.fetch(testing.make_project(tmp_path))


def test_fetch_reports_a_missing_file(tmp_path, index):
  index.publish('apache_beam-9.9.1.tar.gz', testing.SDIST)
  with pytest.raises(Error, match='is not listed'):
    sdist.fetch(testing.make_project(tmp_path))


def test_fetch_from_a_local_copy_is_verified(tmp_path, monkeypatch):
  monkeypatch.setenv('PIP_INDEX_URL', 'http://127.0.0.1:9/simple/')
  project = testing.make_project(tmp_path / 'repo')
  (tmp_path / 'good.tar.gz').write_bytes(testing.SDIST)
  (tmp_path / 'bad.tar.gz').write_bytes(b'bad')
  with pytest.raises(Error, match='refusing it'):
    sdist.fetch(project, tmp_path / 'bad.tar.gz')
  assert sdist.fetch(project,
                     tmp_path / 'good.tar.gz').read_bytes() == testing.SDIST
  # A local copy moves a corrupted cache aside too.
  cached = project.cache / 'apache_beam-9.9.0.tar.gz'
  cached.write_bytes(b'garbage')
  assert sdist.fetch(project,
                     tmp_path / 'good.tar.gz').read_bytes() == testing.SDIST
  (aside, ) = project.cache.glob('*.sha256-*')
  assert aside.read_bytes() == b'garbage'


@pytest.fixture
def pip_settings(tmp_path, monkeypatch):
  """pip with no index settings but those of a config file of the test's."""
  for variable in list(os.environ):
    if variable.startswith('PIP_'):
      monkeypatch.delenv(variable)
  config = tmp_path / 'pip.conf'
  config.write_text('')
  monkeypatch.setenv('PIP_CONFIG_FILE', str(config))
  return config


def test_index_url_is_pip_index_url_first(pip_settings, monkeypatch):
  pip_settings.write_text('[global]\nindex-url = http://127.0.0.1:1/file/\n')
  monkeypatch.setenv(
      'PIP_INDEX_URL', 'http://127.0.0.1:2/env/ http://127.0.0.1:3/more/')
  assert sdist.index_url() == 'http://127.0.0.1:2/env/'


def test_index_url_reads_pips_config(pip_settings):
  pip_settings.write_text('[global]\nindex-url = http://127.0.0.1:1/global/\n')
  assert sdist.index_url() == 'http://127.0.0.1:1/global/'
  pip_settings.write_text(
      '[global]\nindex-url = http://127.0.0.1:1/global/\n'
      '[download]\nindex-url = http://127.0.0.1:1/download/\n')
  assert sdist.index_url() == 'http://127.0.0.1:1/download/'


def test_index_url_falls_back_to_pips_own_default(pip_settings, monkeypatch):
  from pip._internal.models.index import PyPI
  monkeypatch.setenv('PIP_CONFIG_FILE', os.devnull)
  assert sdist.index_url() == PyPI.simple_url


def test_no_index_host_is_named_in_the_code():
  package = sdist.__file__.rsplit('/', 1)[0]
  for name in os.listdir(package):
    if name.endswith('.py') and not name.endswith('_test.py'):
      with open(os.path.join(package, name)) as f:
        assert 'pypi.org' not in f.read(), name


def test_extract_returns_the_release_date(tmp_path):
  tarball = tmp_path / 'x.tar.gz'
  tarball.write_bytes(testing.SDIST)
  assert sdist.extract(tarball, tmp_path / 'out') == testing.RELEASED
  assert (tmp_path / 'out' / 'apache_beam' / 'util.py').read_text() == (
      testing.UTIL)


def test_extract_refuses_several_top_folders(tmp_path):
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode='w:gz') as tar:
    for name in ('one/setup.py', 'two/setup.py'):
      tar.addfile(tarfile.TarInfo(name), io.BytesIO(b''))
  tarball = tmp_path / 'x.tar.gz'
  tarball.write_bytes(buffer.getvalue())
  with pytest.raises(Error, match='x.tar.gz does not have exactly one top'):
    sdist.extract(tarball, tmp_path / 'out')
