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

"""Tests of scripts/beampq.py.

Most tests run the tool on a small project of their own: a fake sdist served
by a real package index on 127.0.0.1, and patches made the way a developer
makes them (commit in the tree, then refresh). The last tests run the real
queue of this repository against the real pinned base.
"""

import hashlib
import http.server
import io
import json
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import beampq  # pylint: disable=wrong-import-position

UTIL = ''.join(f'line {i}\n' for i in range(1, 41))
CHANGES = """\
# [9.9.0] - Unreleased

## New Features / Improvements

* (Python) Added a thing ([#1](https://github.com/apache/beam/issues/1)).

## Bugfixes

* (Python) Fixed a bug ([#2](https://github.com/apache/beam/issues/2)).
"""
UPSTREAM_CHANGES = """\
<!-- license -->
# [9.9.0] - Unreleased

## Highlights

* New highly anticipated feature X added to Python SDK ([#X](https://github.com/apache/beam/issues/X)).

## New Features / Improvements

* X feature added (Java/Python) ([#X](https://github.com/apache/beam/issues/X)).

## Bugfixes

* (Java) Fixed something else ([#3](https://github.com/apache/beam/issues/3)).
* Fixed X (Java/Python) ([#X](https://github.com/apache/beam/issues/X)).

## Known Issues

[comment]: # ( When updating known issues after release, make sure also update website blog in website/www/site/content/blog.)

# [9.8.0] - 2026-01-01

## Bugfixes

* Fixed X (Java/Python) ([#X](https://github.com/apache/beam/issues/X)).
"""
IDENTITY = {
    'GIT_AUTHOR_NAME': 'Test Author',
    'GIT_AUTHOR_EMAIL': 'author@example.com',
    'GIT_COMMITTER_NAME': 'Test Committer',
    'GIT_COMMITTER_EMAIL': 'committer@example.com',
}


def make_sdist(files, top='apache_beam-9.9.0'):
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode='w:gz') as tar:
    for name, text in files.items():
      data = text.encode()
      info = tarfile.TarInfo(f'{top}/{name}')
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return buffer.getvalue()


SDIST = make_sdist({
    'apache_beam/__init__.py': '',
    'apache_beam/util.py': UTIL,
    'setup.cfg': '[yapf]\n',
})


class Index:
  """A package index on 127.0.0.1 serving one project's files."""
  def __init__(self):
    self.files = {}
    self.pages = {}
    self.hits = []
    index = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def do_GET(self):
        index.hits.append(self.path)
        if self.path in index.pages:
          content_type, body = index.pages[self.path]
        elif self.path in index.files:
          content_type, body = 'application/octet-stream', index.files[
              self.path]
        else:
          self.send_error(404)
          return
        self.send_response(200)
        self.send_header('Content-Type', content_type)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

      def log_message(self, *args):
        pass

    self.server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self.url = f'http://127.0.0.1:{self.server.server_port}/simple/'
    threading.Thread(target=self.server.serve_forever, daemon=True).start()

  def publish(self, filename, data, listed_sha=None, html=False):
    sha = listed_sha or hashlib.sha256(data).hexdigest()
    self.files[f'/files/{filename}'] = data
    if html:
      body = (
          f'<html><body><a href="../../files/{filename}#sha256={sha}">'
          f'{filename}</a></body></html>')
      self.pages['/simple/apache-beam/'] = ('text/html', body.encode())
    else:
      body = json.dumps({
          'files': [{
              'filename': filename,
              'url': f'../../files/{filename}',
              'hashes': {
                  'sha256': sha
              }
          }]
      })
      self.pages['/simple/apache-beam/'] = (
          'application/vnd.pypi.simple.v1+json', body.encode())


@pytest.fixture
def index(monkeypatch):
  served = Index()
  monkeypatch.setenv('PIP_INDEX_URL', served.url)
  yield served
  served.server.shutdown()


@pytest.fixture(autouse=True)
def identity(monkeypatch):
  for name, value in IDENTITY.items():
    monkeypatch.setenv(name, value)


def make_project(root: Path, sdist: bytes = SDIST) -> beampq.Project:
  (root / 'patches').mkdir(parents=True)
  (root / 'patches' / 'base.cfg').write_text(
      '[base]\nproject = apache-beam\nversion = 9.9.0\n'
      'filename = apache_beam-9.9.0.tar.gz\n'
      f'sha256 = {hashlib.sha256(sdist).hexdigest()}\n'
      'subdir = sdks/python\n')
  (root / 'patches' / 'series').write_text(beampq.format_series([]))
  (root / 'patches' /
   'pull-request.md').write_text('# [Python] Add a thing\n\nWhy and what.\n')
  (root / 'CHANGES.md').write_text(CHANGES)
  return beampq.Project(root)


def tree_git(project, *args):
  return beampq.git_out(*args, cwd=project.tree, isolated=False)


def commit_in_tree(project, message, files):
  for path, text in files.items():
    target = project.tree / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
  tree_git(project, 'add', '-A')
  tree_git(project, 'commit', '-q', '-m', message)


@pytest.fixture
def project(tmp_path, index):
  """A project whose queue has two patches; the second adds a new file."""
  index.publish('apache_beam-9.9.0.tar.gz', SDIST)
  project = make_project(tmp_path / 'repo')
  beampq.ensure_tree(project)
  commit_in_tree(
      project,
      '[Python] Change line 5\n\nBecause line 5 was wrong.',
      {'sdks/python/apache_beam/util.py': UTIL.replace('line 5\n', 'five\n')})
  commit_in_tree(
      project,
      '[Python] Add a module',
      {
          'sdks/python/apache_beam/util.py': UTIL.replace(
              'line 5\n', 'five\n').replace('line 30\n', 'thirty\n'),
          'sdks/python/apache_beam/new_mod.py': 'NEW = 1\n',
          'sdks/python/apache_beam/new_mod_test.py': 'import unittest\n',
      })
  beampq.refresh(project)
  return project


def tree_id(repo: Path) -> str:
  return beampq.git_out('rev-parse', 'HEAD^{tree}', cwd=repo)


# --------------------------------------------------------------------------
# fetch


def test_fetch_downloads_verifies_and_caches(tmp_path, index):
  index.publish('apache_beam-9.9.0.tar.gz', SDIST)
  project = make_project(tmp_path)
  path = beampq.fetch(project)
  assert path.read_bytes() == SDIST
  hits = len(index.hits)
  assert beampq.fetch(project) == path
  assert len(index.hits) == hits, 'a verified cached file is not fetched again'


def test_fetch_reads_html_simple_pages(tmp_path, index):
  index.publish('apache_beam-9.9.0.tar.gz', SDIST, html=True)
  assert beampq.fetch(make_project(tmp_path)).read_bytes() == SDIST


def test_fetch_refuses_a_corrupted_download(tmp_path, index):
  project = make_project(tmp_path)
  corrupted = SDIST[:-10] + b'0123456789'
  index.publish(
      'apache_beam-9.9.0.tar.gz',
      corrupted,
      listed_sha=hashlib.sha256(SDIST).hexdigest())
  with pytest.raises(beampq.Error, match='has sha256 .* not the pinned'):
    beampq.fetch(project)
  assert not list(project.cache.iterdir()), 'nothing is kept'


def test_fetch_refuses_a_file_the_index_lists_with_another_sha(tmp_path, index):
  project = make_project(tmp_path)
  index.publish('apache_beam-9.9.0.tar.gz', b'other')
  with pytest.raises(beampq.Error, match='index lists .* not the pinned'):
    beampq.fetch(project)
  assert '/files/apache_beam-9.9.0.tar.gz' not in index.hits


def test_fetch_replaces_a_corrupted_cache(tmp_path, index):
  index.publish('apache_beam-9.9.0.tar.gz', SDIST)
  project = make_project(tmp_path)
  project.cache.mkdir(parents=True)
  (project.cache / 'apache_beam-9.9.0.tar.gz').write_bytes(b'garbage')
  assert beampq.fetch(project).read_bytes() == SDIST


def test_fetch_reports_an_unreachable_index(tmp_path, monkeypatch):
  monkeypatch.setenv('PIP_INDEX_URL', 'http://127.0.0.1:9/simple/')
  with pytest.raises(beampq.Error, match='cannot read the package index'):
    beampq.fetch(make_project(tmp_path))


def test_fetch_reports_a_missing_file(tmp_path, index):
  index.publish('apache_beam-9.9.1.tar.gz', SDIST)
  with pytest.raises(beampq.Error, match='is not listed'):
    beampq.fetch(make_project(tmp_path))


def test_fetch_from_a_local_copy_is_verified(tmp_path, monkeypatch):
  monkeypatch.setenv('PIP_INDEX_URL', 'http://127.0.0.1:9/simple/')
  project = make_project(tmp_path / 'repo')
  (tmp_path / 'good.tar.gz').write_bytes(SDIST)
  (tmp_path / 'bad.tar.gz').write_bytes(b'bad')
  with pytest.raises(beampq.Error, match='refusing it'):
    beampq.fetch(project, tmp_path / 'bad.tar.gz')
  assert beampq.fetch(project, tmp_path / 'good.tar.gz').read_bytes() == SDIST


# --------------------------------------------------------------------------
# tree and refresh


def test_tree_has_the_base_then_one_commit_per_patch(project):
  subjects = tree_git(project, 'log', '--reverse', '--format=%s').splitlines()
  assert subjects == [
      'apache-beam 9.9.0 sdist (pristine base)',
      '[Python] Change line 5',
      '[Python] Add a module',
  ]
  assert (project.tree / 'sdks/python/setup.cfg').read_text() == '[yapf]\n'
  added = tree_git(
      project, 'show', '--name-only', '--diff-filter=A', '--format=', 'HEAD')
  assert added.split() == [
      'sdks/python/apache_beam/new_mod.py',
      'sdks/python/apache_beam/new_mod_test.py',
  ]


def test_refresh_writes_patches_series_and_new_files(project):
  entries = project.series()
  assert [e.patch for e in entries] == [
      '0001-Python-Change-line-5.patch', '0002-Python-Add-a-module.patch'
  ]
  assert entries[1].new_files == [
      'sdks/python/apache_beam/new_mod.py',
      'sdks/python/apache_beam/new_mod_test.py',
  ]
  second = (project.patches / entries[1].patch).read_text()
  assert 'Subject: [PATCH] [Python] Add a module' in second
  assert '+thirty' in second
  assert 'new_mod' not in second, 'new files travel in sdks/, not patches'
  assert (project.root /
          'sdks/python/apache_beam/new_mod.py').read_text() == 'NEW = 1\n'


def test_rebuilt_tree_equals_the_refreshed_one(project):
  edited = tree_id(project.tree)
  beampq.ensure_tree(project, force=True)
  assert tree_id(project.tree) == edited
  beampq.check(project)


def test_tree_is_idempotent(project, capsys):
  head = tree_git(project, 'rev-parse', 'HEAD')
  beampq.ensure_tree(project, force=True)
  rebuilt = tree_git(project, 'rev-parse', 'HEAD')
  capsys.readouterr()
  beampq.ensure_tree(project)
  assert 'up to date' in capsys.readouterr().out
  assert tree_git(project, 'rev-parse', 'HEAD') == rebuilt
  beampq.ensure_tree(project, force=True)
  assert tree_git(project, 'rev-parse',
                  'HEAD') == rebuilt, ('builds are reproducible')
  assert head  # the developer's own commits had other ids


def test_tree_keeps_unexported_work(project):
  commit_in_tree(project, 'More', {'sdks/python/apache_beam/util.py': 'x\n'})
  with pytest.raises(beampq.Error, match='has work that is not in patches'):
    beampq.ensure_tree(project)
  assert tree_git(project, 'log', '-1', '--format=%s') == 'More'
  beampq.ensure_tree(project, force=True)
  assert tree_git(
      project, 'log', '-1', '--format=%s') == '[Python] Add a module'


def test_amended_commit_round_trips(project):
  tree_git(project, 'rebase', '-q', '--exec', 'true', beampq.PRISTINE_TAG)
  (project.tree / 'sdks/python/apache_beam/new_mod.py').write_text('NEW = 2\n')
  tree_git(project, 'commit', '-qa', '--amend', '--no-edit')
  beampq.refresh(project)
  assert (project.root /
          'sdks/python/apache_beam/new_mod.py').read_text() == 'NEW = 2\n'
  beampq.check(project)


def test_refresh_refuses_a_dirty_tree(project):
  (project.tree / 'sdks/python/apache_beam/util.py').write_text('dirty\n')
  with pytest.raises(beampq.Error, match='uncommitted changes'):
    beampq.refresh(project)


def test_refresh_refuses_a_new_file_changed_by_a_later_commit(project):
  commit_in_tree(
      project, 'Touch it', {'sdks/python/apache_beam/new_mod.py': 'NEW = 3\n'})
  with pytest.raises(beampq.Error, match='fold the change into the commit'):
    beampq.refresh(project)


def test_refresh_keeps_a_commit_that_only_adds_files(project):
  commit_in_tree(project, 'Only new', {'sdks/python/apache_beam/x.py': 'X\n'})
  beampq.refresh(project)
  entry = project.series()[-1]
  assert entry.new_files == ['sdks/python/apache_beam/x.py']
  assert 'diff --git' not in (project.patches / entry.patch).read_text()
  edited = tree_id(project.tree)
  shutil.rmtree(project.tree)
  beampq.ensure_tree(project)
  assert tree_id(project.tree) == edited


def test_a_patch_that_does_not_apply_fails_and_leaves_no_tree(project):
  patch = project.patches / project.series()[1].patch
  patch.write_text(patch.read_text().replace(' line 29\n', ' line 29 !\n'))
  shutil.rmtree(project.tree)
  with pytest.raises(beampq.Error) as raised:
    beampq.ensure_tree(project)
  assert '0002-Python-Add-a-module.patch does not apply' in str(raised.value)
  assert 'sdks/python/apache_beam/util.py' in str(raised.value)
  assert not project.tree.exists()
  assert [p.name for p in project.build.iterdir()] == ['cache']


def test_a_failed_rebuild_keeps_the_previous_tree(project):
  head = tree_git(project, 'rev-parse', 'HEAD')
  patch = project.patches / project.series()[1].patch
  patch.write_text(patch.read_text().replace(' line 29\n', ' line 29 !\n'))
  with pytest.raises(beampq.Error, match='does not apply'):
    beampq.ensure_tree(project)
  assert tree_git(project, 'rev-parse', 'HEAD') == head
  with pytest.raises(beampq.Error, match='does not apply'):
    beampq.ensure_tree(project)


def test_a_patch_that_needs_an_offset_is_refused(tmp_path, index):
  moved = make_sdist({
      'apache_beam/__init__.py': '',
      'apache_beam/util.py': 'extra\nextra\n' + UTIL,
      'setup.cfg': '[yapf]\n',
  })
  index.publish('apache_beam-9.9.0.tar.gz', SDIST)
  project = make_project(tmp_path / 'repo')
  beampq.ensure_tree(project)
  commit_in_tree(
      project,
      'Change',
      {'sdks/python/apache_beam/util.py': UTIL.replace('line 20\n', 'x\n')})
  beampq.refresh(project)
  index.publish('apache_beam-9.9.0.tar.gz', moved)
  other = make_project(tmp_path / 'other', sdist=moved)
  shutil.copy(project.patches / project.series()[0].patch, other.patches)
  shutil.copy(project.series_file, other.series_file)
  with pytest.raises(beampq.Error, match='applies only with an offset'):
    beampq.ensure_tree(other)


def test_a_missing_patch_or_new_file_is_named(project):
  shutil.rmtree(project.tree)
  (project.root / 'sdks/python/apache_beam/new_mod.py').unlink()
  with pytest.raises(beampq.Error,
                     match='lists sdks/python/apache_beam/new_mod'
                     '.py under 0002-Python-Add-a-module.patch, but'):
    beampq.ensure_tree(project)
  (project.patches / project.series()[0].patch).unlink()
  with pytest.raises(beampq.Error,
                     match='names patches/0001-Python-Change-line-5.patch, '
                     'which does not exist'):
    beampq.ensure_tree(project)
  assert not project.tree.exists()


# --------------------------------------------------------------------------
# check


def test_check_passes_on_a_consistent_queue_without_a_tree(project):
  shutil.rmtree(project.tree)
  beampq.check(project)
  assert not project.tree.exists()


def test_check_fails_on_a_hand_edited_patch(project, capsys):
  # The edited patch still applies, but its index line no longer matches
  # what the tree exports.
  patch = project.patches / project.series()[0].patch
  patch.write_text(patch.read_text().replace('+five', '+FIVE'))
  with pytest.raises(beampq.Error, match='check found 2 problems'):
    beampq.check(project)
  assert '0001-Python-Change-line-5.patch is stale' in capsys.readouterr().err


def test_check_fails_on_stray_and_missing_files(project, capsys):
  (project.root / 'sdks/python/apache_beam/stray.py').write_text('')
  (project.patches / '0009-stray.patch').write_text('')
  with pytest.raises(beampq.Error, match='check found 2 problems'):
    beampq.check(project)
  err = capsys.readouterr().err
  assert 'stray.py is not listed in the series' in err
  assert '0009-stray.patch is not in the series' in err


def test_check_fails_on_unexported_work(project):
  commit_in_tree(project, 'More', {'sdks/python/apache_beam/util.py': 'x\n'})
  with pytest.raises(beampq.Error, match='check found 1 problems'):
    beampq.check(project)


def test_check_fails_on_a_bad_changes_entry(project):
  project.changes.write_text(CHANGES.replace('([#2](https', '(see [#2](https'))
  with pytest.raises(beampq.Error, match='check found 1 problems'):
    beampq.check(project)


def test_series_errors_name_the_line():
  with pytest.raises(beampq.Error, match='series:2: expected'):
    beampq.parse_series('a.patch\n  sdks/x.py\n')
  with pytest.raises(beampq.Error, match='is not under sdks/'):
    beampq.parse_series('a.patch\n  + ../x.py\n')
  with pytest.raises(beampq.Error, match='listed more than once'):
    beampq.parse_series('a.patch\na.patch\n')
  entries = beampq.parse_series(
      beampq.format_series([beampq.Entry('a.patch', ['sdks/x.py'])]))
  assert entries == [beampq.Entry('a.patch', ['sdks/x.py'])]


# --------------------------------------------------------------------------
# apply and export


def make_checkout(project, path: Path, changes: str = None) -> Path:
  """A Beam checkout at the pristine base (optionally with a CHANGES.md)."""
  subprocess.run(['git', 'clone', '-q', str(project.tree), str(path)],
                 check=True)
  beampq.git('reset', '-q', '--hard', beampq.PRISTINE_TAG, cwd=path)
  if changes is not None:
    (path / 'CHANGES.md').write_text(changes)
    beampq.git('add', 'CHANGES.md', cwd=path, isolated=False)
    beampq.git('commit', '-q', '-m', 'changes', cwd=path, isolated=False)
  return path


def test_apply_reproduces_the_tree(project, tmp_path, capsys):
  checkout = make_checkout(project, tmp_path / 'beam')
  assert beampq.main(['--project', str(project.root), 'apply',
                      str(checkout)]) == 0
  assert tree_id(checkout) == tree_id(project.tree)
  assert 'no CHANGES.md there' in capsys.readouterr().out


def test_apply_inserts_changes_entries(project, tmp_path):
  checkout = make_checkout(project, tmp_path / 'beam', UPSTREAM_CHANGES)
  beampq.apply(project, checkout)
  text = (checkout / 'CHANGES.md').read_text()
  unreleased, released = text.split('# [9.8.0]')
  assert '* (Python) Added a thing' in unreleased
  assert 'X feature added' not in unreleased, 'the placeholder goes'
  bugfixes = unreleased.split('## Bugfixes')[1].split('##')[0].strip()
  assert bugfixes.splitlines() == [
      '* (Java) Fixed something else '
      '([#3](https://github.com/apache/beam/issues/3)).',
      '* (Python) Fixed a bug ([#2](https://github.com/apache/beam/issues/2)).',
      '* Fixed X (Java/Python) ([#X](https://github.com/apache/beam/issues/X)).',
  ]
  assert 'Fixed a bug' not in released
  assert beampq.git_out('status', '--porcelain', cwd=checkout) == ''
  assert beampq.git_out(
      'log', '-1', '--format=%s',
      cwd=checkout).startswith('Add CHANGES.md entries')


def test_insert_changes_is_idempotent_and_adds_missing_headings():
  entries = beampq.read_changes_text(CHANGES)
  once, added = beampq.insert_changes(UPSTREAM_CHANGES, entries)
  assert added == 2
  twice, added = beampq.insert_changes(once, entries)
  assert (twice, added) == (once, 0)
  bare = '# [1.0.0] - Unreleased\n\n## Highlights\n\n# [0.9.0] - 2020\n'
  text, added = beampq.insert_changes(bare, entries)
  assert added == 2
  assert text.index('## Bugfixes') < text.index('# [0.9.0]')
  assert beampq.read_changes_text(text) == entries


@pytest.mark.parametrize(
    'setup, message',
    [
        ('dirty', 'has uncommitted changes'),
        ('not_git', 'is not the top of a git checkout'),
        ('not_beam', 'is not a Beam checkout'),
    ])
def test_apply_refuses_bad_checkouts(project, tmp_path, setup, message):
  checkout = tmp_path / 'beam'
  if setup == 'dirty':
    make_checkout(project, checkout)
    (checkout / 'sdks/python/apache_beam/util.py').write_text('mine\n')
  elif setup == 'not_git':
    checkout.mkdir()
  else:
    checkout.mkdir()
    beampq.git('init', '-q', cwd=checkout)
  with pytest.raises(beampq.Error, match=message):
    beampq.apply(project, checkout)
  if setup == 'dirty':
    assert (checkout /
            'sdks/python/apache_beam/util.py').read_text() == 'mine\n'


def test_apply_leaves_the_checkout_as_it_was_on_failure(project, tmp_path):
  checkout = make_checkout(project, tmp_path / 'beam')
  conflicting = UTIL.replace('line 30\n', 'mine\n')
  (checkout / 'sdks/python/apache_beam/util.py').write_text(conflicting)
  beampq.git('commit', '-qam', 'mine', cwd=checkout, isolated=False)
  head = beampq.git_out('rev-parse', 'HEAD', cwd=checkout)
  with pytest.raises(beampq.Error) as raised:
    beampq.apply(project, checkout)
  assert '0002-Python-Add-a-module.patch does not apply' in str(raised.value)
  assert beampq.git_out('rev-parse', 'HEAD', cwd=checkout) == head
  assert beampq.git_out('status', '--porcelain', cwd=checkout) == ''
  assert beampq.operation_in_progress(checkout) is None


def test_export_series(project, tmp_path):
  dest = tmp_path / 'out'
  beampq.export(project, dest, squash=False)
  names = sorted(p.name for p in dest.iterdir())
  assert names == [
      '0001-Python-Change-line-5.patch',
      '0002-Python-Add-a-module.patch',
      'CHANGES-entries.md',
  ]
  second = (dest / '0002-Python-Add-a-module.patch').read_text()
  assert '[PATCH 2/2]' in second and 'new_mod.py' in second
  checkout = make_checkout(project, tmp_path / 'beam')
  beampq.git(
      'am',
      '-q',
      *sorted(str(p) for p in dest.glob('*.patch')),
      cwd=checkout,
      isolated=False)
  assert tree_id(checkout) == tree_id(project.tree)
  with pytest.raises(beampq.Error, match='already exists'):
    beampq.export(project, dest, squash=False)


def test_export_squashed(project, tmp_path):
  dest = tmp_path / 'out'
  beampq.export(project, dest, squash=True)
  patches = list(dest.glob('*.patch'))
  assert len(patches) == 1
  text = patches[0].read_text()
  assert 'Subject: [PATCH] [Python] Add a thing' in text
  assert 'Why and what.' in text
  assert 'From: Test Author <author@example.com>' in text


def test_main_reports_errors_in_one_line(tmp_path, capsys, monkeypatch):
  monkeypatch.setenv('PIP_INDEX_URL', 'http://127.0.0.1:9/simple/')
  project = make_project(tmp_path)
  assert beampq.main(['--project', str(project.root), 'tree']) == 1
  err = capsys.readouterr().err.strip()
  assert err.startswith('beampq: error: cannot read the package index')
  assert len(err.splitlines()) == 1


def test_regression_failures_are_classified():
  verdicts = beampq.classify_failures(
      failed=['a.py::old', 'a.py::flaky', 'b.py::new'],
      failed_again=['a.py::old', 'b.py::new'],
      failed_before=['a.py::old', 'c.py::other'])
  assert verdicts == {
      'also fails on the pristine base': ['a.py::old'],
      'flaky: passed when rerun': ['a.py::flaky'],
      'NEW': ['b.py::new'],
  }


def test_regression_modules_cover_batch_elements_users(tmp_path):
  sdk = tmp_path
  files = {
      'apache_beam/transforms/util_test.py': '',
      'apache_beam/ml/inference/base_test.py': '',
      'apache_beam/io/uses.py': 'beam.BatchElements()',
      'apache_beam/io/uses_test.py': '',
      'apache_beam/io/other.py': '',
      'apache_beam/io/other_test.py': '',
      'apache_beam/examples/ex.py': 'BatchElements',
      'apache_beam/examples/ex_test.py': '',
  }
  for path, text in files.items():
    (sdk / path).parent.mkdir(parents=True, exist_ok=True)
    (sdk / path).write_text(text)
  assert beampq.regression_modules(sdk) == [
      'apache_beam/io/uses_test.py',
      'apache_beam/ml/inference/base_test.py',
      'apache_beam/transforms/util_test.py',
  ]


# --------------------------------------------------------------------------
# The real queue against the real pinned base.


@pytest.fixture(scope='module')
def real_tree(tmp_path_factory):
  project = beampq.Project()
  tree = tmp_path_factory.mktemp('real') / 'beam'
  beampq.build_tree(project, tree)
  return project, tree


def test_format_leaves_files_outside_the_package_alone(project):
  # Beam formats apache_beam/ with yapf, but not setup.py.
  setup = "setup(name='apache-beam',\n  packages = [ 'apache_beam' ])\n"
  commit_in_tree(
      project,
      '[Python] Touch setup.py',
      {
          'sdks/python/setup.py': setup,
          'sdks/python/apache_beam/util.py': 'UTIL = 1\n',
          'sdks/python/apache_beam/new_mod.py': 'NEW = [ 1,2 ]\n',
      })
  beampq.format_tree(project)
  sdk = project.tree / 'sdks/python'
  assert (sdk / 'setup.py').read_text() == setup
  assert (sdk / 'apache_beam/new_mod.py').read_text() == 'NEW = [1, 2]\n'


def test_real_queue_is_consistent():
  beampq.check(beampq.Project())


def test_real_queue_applies_to_a_pristine_checkout(real_tree, tmp_path):
  project, tree = real_tree
  checkout = tmp_path / 'beam'
  subprocess.run(['git', 'clone', '-q', str(tree), str(checkout)], check=True)
  beampq.git('reset', '-q', '--hard', beampq.PRISTINE_TAG, cwd=checkout)
  beampq.apply(project, checkout)
  assert tree_id(checkout) == tree_id(tree)


def test_real_changes_entries_are_in_beams_format():
  entries = beampq.read_changes(beampq.Project().changes)
  assert entries, 'CHANGES.md has entries'
  for heading in entries:
    assert heading in (
        'Highlights',
        'I/Os',
        'New Features / Improvements',
        'Breaking Changes',
        'Deprecations',
        'Bugfixes',
        'Security Fixes',
        'Known Issues')
