#!/usr/bin/env python3
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

"""beampq: the patch queue of this repository against a pinned Beam release.

The queue is ``patches/series``: patches to existing upstream files, in
``git format-patch`` form, plus the new files each patch adds, kept under
``sdks/`` at their upstream paths. The workflow follows Debian's ``gbp pq``:

  fetch    download the pinned sdist (``patches/base.cfg``) and check sha256
  tree     import the queue as commits: ``build/beam`` is a git repository
           shaped like a Beam checkout whose first commit (tag ``pristine``)
           is the sdist and which has one commit per patch
  refresh  export the commits of ``build/beam`` back to ``patches/`` and
           ``sdks/`` after editing them there (commit, amend, rebase -i)
  check    fail when ``patches/``, ``sdks/``, the series and the tree disagree
  apply    apply the queue to a Beam checkout with ``git am -3`` and add our
           CHANGES.md entries to its Unreleased section
  export   write a git-am-able series, or one squashed patch, for upstream

and the gates run on the patched tree (see tox.ini):

  test     Beam's pytest setup on the test modules the queue touches
  lint     ruff and pyrefly (ratchet against the pristine base), yapf --diff
           and the unittest.main check, as Beam's lint env runs them
  pylint   pylint with Beam's legacy .pylintrc settings (ratchet)
  mypy     mypy with Beam's legacy mypy.ini settings (ratchet)
  format   yapf and ruff's import sorting in place, in the tree

Errors are one line on stderr and a non-zero exit; no command leaves a tree
that a later run would trust when it fails half way.
"""

import argparse
import collections
import configparser
import contextlib
import dataclasses
import hashlib
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterable
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
# Bump when the way a tree is built changes, so existing trees are rebuilt.
TREE_FORMAT = '1'
PRISTINE_TAG = 'pristine'
# Commits made by the tool are reproducible: fixed identity and dates.
TOOL_IDENTITY = {
    'GIT_AUTHOR_NAME': 'beampq',
    'GIT_AUTHOR_EMAIL': 'beampq@localhost',
    'GIT_AUTHOR_DATE': '2026-01-01T00:00:00+0000',
    'GIT_COMMITTER_NAME': 'beampq',
    'GIT_COMMITTER_EMAIL': 'beampq@localhost',
    'GIT_COMMITTER_DATE': '2026-01-01T00:00:00+0000',
}
# Build outputs that must not make the tree look edited.
TREE_EXCLUDES = [
    '__pycache__/',
    '*.pyc',
    '.pytest_cache/',
    '.mypy_cache/',
    '*.so',
    '*.c',
    '*.egg-info/',
    'build/',
    'pytest_*.xml'
]
SERIES_HEADER = """\
# The patch queue, applied in order to the base in base.cfg.
# One patch per line; the indented "+ path" lines under a patch name the
# new files (kept under sdks/) that the patch's commit adds.
# Written by `scripts/beampq.py refresh`.
"""
CHANGES_HEADING = re.compile(r'^# \[[^\]]+\] - Unreleased\s*$')
PLACEHOLDER = '[#X]'


class Error(Exception):
  """A failure reported to the user as one line."""


# --------------------------------------------------------------------------
# The project: base pin, series, paths.


@dataclasses.dataclass(frozen=True)
class Base:
  project: str
  version: str
  filename: str
  sha256: str
  subdir: str

  @classmethod
  def load(cls, path: Path) -> 'Base':
    parser = configparser.ConfigParser()
    if not parser.read(path):
      raise Error(f'{path} is missing')
    try:
      section = parser['base']
      base = cls(**{f.name: section[f.name] for f in dataclasses.fields(cls)})
    except KeyError as e:
      raise Error(f'{path}: missing {e.args[0]!r} in [base]') from None
    if not re.fullmatch(r'[0-9a-f]{64}', base.sha256):
      raise Error(f'{path}: sha256 {base.sha256!r} is not 64 hex digits')
    return base


@dataclasses.dataclass
class Entry:
  """One patch of the series and the new files its commit adds."""
  patch: str
  new_files: list[str] = dataclasses.field(default_factory=list)


def parse_series(text: str, where: str = 'series') -> list[Entry]:
  entries: list[Entry] = []
  for lineno, raw in enumerate(text.splitlines(), 1):
    line = raw.split('#', 1)[0].rstrip()
    if not line.strip():
      continue
    if raw[0].isspace():
      item = line.strip()
      if not item.startswith('+ ') or not entries:
        raise Error(
            f'{where}:{lineno}: expected "+ <new file>" under a patch, '
            f'got {item!r}')
      path = item[2:].strip()
      if (not path.startswith('sdks/') or '..' in Path(path).parts or
          Path(path).is_absolute()):
        raise Error(f'{where}:{lineno}: new file {path!r} is not under sdks/')
      entries[-1].new_files.append(path)
    else:
      if '/' in line or not line.endswith('.patch'):
        raise Error(f'{where}:{lineno}: {line!r} is not a patch file name')
      entries.append(Entry(line))
  seen: dict[str, int] = collections.Counter(
      [e.patch for e in entries] + [f for e in entries for f in e.new_files])
  duplicates = sorted(name for name, count in seen.items() if count > 1)
  if duplicates:
    raise Error(f'{where}: {duplicates[0]} is listed more than once')
  return entries


def format_series(entries: Iterable[Entry]) -> str:
  lines = [SERIES_HEADER.rstrip('\n')]
  for entry in entries:
    lines.append(entry.patch)
    lines.extend(f'  + {path}' for path in entry.new_files)
  return '\n'.join(lines) + '\n'


class Project:
  """The paths of a patch-set repository (this one, or one made by a test)."""
  def __init__(self, root: Path = ROOT):
    self.root = root.resolve()
    self.patches = self.root / 'patches'
    self.series_file = self.patches / 'series'
    self.sdks = self.root / 'sdks'
    self.changes = self.root / 'CHANGES.md'
    self.pull_request = self.patches / 'pull-request.md'
    self.build = self.root / 'build'
    self.tree = self.build / 'beam'
    self.cache = self.build / 'cache'
    self.pristine = self.build / 'pristine'
    self.base = Base.load(self.patches / 'base.cfg')

  def series(self) -> list[Entry]:
    if not self.series_file.exists():
      raise Error(f'{self.rel(self.series_file)} is missing')
    return parse_series(
        self.series_file.read_text(), where=self.rel(self.series_file))

  def rel(self, path: Path) -> str:
    try:
      return str(path.relative_to(self.root))
    except ValueError:
      return str(path)

  def inputs_digest(self) -> str:
    """A digest of everything a tree is built from."""
    digest = hashlib.sha256()

    def add(label: str, data: bytes):
      digest.update(f'{label}\0{len(data)}\0'.encode())
      digest.update(data)

    add('format', TREE_FORMAT.encode())
    add('base', f'{self.base.sha256} {self.base.subdir}'.encode())
    add('series', _read_bytes(self.series_file))
    for entry in self.series():
      add(entry.patch, _read_bytes(self.patches / entry.patch))
      for path in entry.new_files:
        add(path, _read_bytes(self.root / path))
    return digest.hexdigest()


def _read_bytes(path: Path) -> bytes:
  return path.read_bytes() if path.is_file() else b'\0missing'


# --------------------------------------------------------------------------
# git helpers.


def git(
    *args: str,
    cwd: Path,
    isolated: bool = True,
    env: Optional[dict[str, str]] = None,
    check: bool = True) -> subprocess.CompletedProcess:
  """Runs git; isolated runs ignore the user's and system's git config."""
  full_env = dict(os.environ, LC_ALL='C', TZ='UTC')
  if isolated:
    full_env.update(GIT_CONFIG_NOSYSTEM='1', GIT_CONFIG_GLOBAL=os.devnull)
  full_env.update(env or {})
  result = subprocess.run(['git', *args],
                          cwd=cwd,
                          env=full_env,
                          capture_output=True,
                          text=True,
                          check=False)
  if check and result.returncode != 0:
    message = (result.stderr or result.stdout).strip().splitlines()
    raise Error(
        f'git {" ".join(args[:2])} failed in {cwd}: '
        f'{message[-1] if message else result.returncode}')
  return result


def git_out(*args: str, cwd: Path, **kwargs) -> str:
  return git(*args, cwd=cwd, **kwargs).stdout.strip()


def is_dirty(repo: Path, isolated: bool = True) -> list[str]:
  return git_out(
      'status', '--porcelain', cwd=repo, isolated=isolated).splitlines()


def operation_in_progress(repo: Path) -> Optional[str]:
  git_dir = Path(git_out('rev-parse', '--absolute-git-dir', cwd=repo))
  for name, what in (('rebase-apply', 'git am or rebase'),
                     ('rebase-merge', 'rebase'), ('MERGE_HEAD', 'merge'),
                     ('CHERRY_PICK_HEAD', 'cherry-pick')):
    if (git_dir / name).exists():
      return what
  return None


# --------------------------------------------------------------------------
# fetch: the pinned sdist through the package index.


def index_url() -> str:
  """The index pip uses: PIP_INDEX_URL, pip's config, or PyPI."""
  url = os.environ.get('PIP_INDEX_URL', '').split()
  if url:
    return url[0]
  try:
    configured = subprocess.run(
        [sys.executable, '-m', 'pip', 'config', 'get', 'global.index-url'],
        capture_output=True,
        text=True,
        timeout=60,
        check=False)
    if configured.returncode == 0 and configured.stdout.strip():
      return configured.stdout.strip().split()[0]
  except (OSError, subprocess.SubprocessError):
    pass
  return 'https://pypi.org/simple/'


class _Anchors(html.parser.HTMLParser):
  def __init__(self):
    super().__init__()
    self.links: list[tuple[str, str]] = []
    self._href: Optional[str] = None

  def handle_starttag(self, tag, attrs):
    if tag == 'a':
      self._href = dict(attrs).get('href')

  def handle_data(self, data):
    if self._href is not None:
      self.links.append((data.strip(), self._href))
      self._href = None


def find_sdist(index: str, base: Base) -> tuple[str, Optional[str]]:
  """Returns the URL of the base sdist and the sha256 the index gives."""
  name = re.sub(r'[-_.]+', '-', base.project).lower()
  page = index.rstrip('/') + f'/{name}/'
  request = urllib.request.Request(
      page,
      headers={
          'Accept': 'application/vnd.pypi.simple.v1+json, '
          'text/html;q=0.1'
      })
  try:
    with urllib.request.urlopen(request, timeout=60) as response:
      content_type = response.headers.get('Content-Type', '')
      body = response.read().decode('utf-8', 'replace')
  except (urllib.error.URLError, OSError) as e:
    reason = getattr(e, 'reason', e)
    raise Error(f'cannot read the package index at {page}: {reason}') from None
  if 'json' in content_type:
    for item in json.loads(body).get('files', []):
      if item.get('filename') == base.filename:
        return (
            urllib.parse.urljoin(page, item['url']),
            item.get('hashes', {}).get('sha256'))
  else:
    anchors = _Anchors()
    anchors.feed(body)
    for text, href in anchors.links:
      if text == base.filename:
        url, _, fragment = urllib.parse.urljoin(page, href).partition('#')
        hashes = urllib.parse.parse_qs(fragment)
        return url, (hashes.get('sha256') or [None])[0]
  raise Error(f'{base.filename} is not listed by the package index at {page}')


def sha256_of(path: Path) -> str:
  digest = hashlib.sha256()
  with path.open('rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def fetch(project: Project, source: Optional[Path] = None) -> Path:
  """Returns the cached base sdist, downloading (or copying) it if needed."""
  base = project.base
  target = project.cache / base.filename
  if target.exists() and source is None:
    actual = sha256_of(target)
    if actual == base.sha256:
      return target
    target.unlink()
    print(
        f'beampq: removed cached {project.rel(target)}: sha256 {actual} '
        f'is not the pinned {base.sha256}',
        file=sys.stderr)
  project.cache.mkdir(parents=True, exist_ok=True)
  partial = target.with_name(target.name + '.part')
  if source is not None:
    origin = str(source)
    if not source.is_file():
      raise Error(f'{source} does not exist')
    shutil.copyfile(source, partial)
  else:
    url, listed = find_sdist(index_url(), base)
    if listed and listed != base.sha256:
      raise Error(
          f'the index lists {base.filename} with sha256 {listed}, not the '
          f'pinned {base.sha256}; refusing it')
    origin = url
    print(f'beampq: downloading {url}')
    try:
      with urllib.request.urlopen(url, timeout=300) as response, \
          partial.open('wb') as out:
        shutil.copyfileobj(response, out)
    except (urllib.error.URLError, OSError) as e:
      partial.unlink(missing_ok=True)
      reason = getattr(e, 'reason', e)
      raise Error(f'cannot download {url}: {reason}') from None
  actual = sha256_of(partial)
  if actual != base.sha256:
    partial.unlink()
    raise Error(
        f'{base.filename} from {origin} has sha256 {actual}, not the pinned '
        f'{base.sha256}; refusing it')
  partial.replace(target)
  print(f'beampq: {project.rel(target)} verified (sha256 {actual[:12]}...)')
  return target


# --------------------------------------------------------------------------
# tree: import the queue as commits.


def _extract_sdist(tarball: Path, dest: Path):
  """Extracts the sdist's single top folder into dest."""
  dest.mkdir(parents=True)
  with tarfile.open(tarball) as tar:
    members = tar.getmembers()
    tops = {m.name.split('/', 1)[0] for m in members}
    if len(tops) != 1:
      raise Error(f'{tarball.name} does not have exactly one top folder')
    top = tops.pop()
    for member in members:
      if member.name == top:
        continue
      member.name = member.name.split('/', 1)[1]
      tar.extract(member, dest, filter='data')


def _check_applies(tree: Path, patch: Path, label: str):
  """Fails unless the patch applies exactly: no fuzz, no offsets."""
  if '\ndiff --git ' not in patch.read_text():
    return  # Only new files, which travel in sdks/: nothing to apply.
  check = git(
      'apply', '--check', '--verbose', str(patch), cwd=tree, check=False)
  output = check.stdout + check.stderr
  if check.returncode != 0:
    failed = re.search(r'error: patch failed: (\S+):(\d+)', output)
    missing = re.search(r'error: (\S+): (does not exist|No such file)', output)
    if failed:
      where = f'{failed.group(1)} (hunk at line {failed.group(2)})'
    elif missing:
      where = f'{missing.group(1)} (no such file)'
    else:
      where = output.strip().splitlines()[-1] if output.strip() else '?'
    raise Error(f'{label} does not apply: {where}')
  moved = re.search(r'Hunk #(\d+) succeeded at (\d+) \((offset|fuzz)', output)
  if moved:
    current = re.findall(
        r'^Checking patch (\S+)\.\.\.', output[:moved.start()], re.M)
    raise Error(
        f'{label} applies only with an {moved.group(3)}: '
        f'{current[-1] if current else "?"} hunk #{moved.group(1)} lands at '
        f'line {moved.group(2)}')


def _write_stamp(tree: Path, **state: str):
  git_dir = tree / '.git'
  (git_dir / 'beampq.json').write_text(json.dumps(state, indent=1) + '\n')


def read_stamp(tree: Path) -> Optional[dict[str, str]]:
  stamp = tree / '.git' / 'beampq.json'
  if not stamp.is_file():
    return None
  try:
    return json.loads(stamp.read_text())
  except ValueError:
    return None


def build_tree(project: Project, dest: Path, quiet: bool = False) -> str:
  """Builds a patched tree in dest (which must not exist); returns HEAD."""
  base = project.base
  tarball = fetch(project)
  entries = project.series()
  say = (lambda *a: None) if quiet else print
  dest.mkdir(parents=True)
  git('init', '-q', '-b', 'main', cwd=dest)
  git('config', 'core.excludesFile', os.devnull, cwd=dest)
  (dest / '.git' / 'info').mkdir(exist_ok=True)
  (dest / '.git' / 'info' / 'exclude').write_text('\n'.join(TREE_EXCLUDES))
  _extract_sdist(tarball, dest / base.subdir)
  git('add', '-A', cwd=dest)
  git(
      'commit',
      '-q',
      '-m',
      f'{base.project} {base.version} sdist (pristine base)\n\n'
      f'{base.filename}, sha256 {base.sha256}, extracted into {base.subdir}.',
      cwd=dest,
      env=TOOL_IDENTITY)
  git('tag', PRISTINE_TAG, cwd=dest)
  base_commit = git_out('rev-parse', 'HEAD', cwd=dest)
  say(
      f'beampq: base {base.project} {base.version} -> '
      f'{base_commit[:12]} (tag {PRISTINE_TAG})')
  committer = {k: v for k, v in TOOL_IDENTITY.items() if 'COMMITTER' in k}
  for entry in entries:
    patch = project.patches / entry.patch
    label = f'patches/{entry.patch}'
    if not patch.is_file():
      raise Error(
          f'{project.rel(project.series_file)} names {label}, '
          'which does not exist')
    _check_applies(dest, patch, label)
    applied = git(
        'am',
        '--quiet',
        '--keep-non-patch',
        '--empty=keep',
        str(patch),
        cwd=dest,
        env=committer,
        check=False)
    if applied.returncode != 0:
      git('am', '--abort', cwd=dest, check=False)
      raise Error(
          f'{label} does not apply: git am failed: '
          f'{applied.stderr.strip().splitlines()[-1:]}')
    for path in entry.new_files:
      source = project.root / path
      if not source.is_file():
        raise Error(
            f'{project.rel(project.series_file)} lists {path} under '
            f'{entry.patch}, but {path} does not exist')
      target = dest / path
      if target.exists():
        raise Error(
            f'{path} is listed as a new file of {entry.patch}, but '
            'the tree already has it')
      target.parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(source, target)
      git('add', path, cwd=dest)
    if entry.new_files:
      git('commit', '-q', '--amend', '--no-edit', cwd=dest, env=committer)
    head = git_out('rev-parse', 'HEAD', cwd=dest)
    extra = f' + {len(entry.new_files)} new files' if entry.new_files else ''
    say(f'beampq: applied {entry.patch}{extra} -> {head[:12]}')
  head = git_out('rev-parse', 'HEAD', cwd=dest)
  _write_stamp(
      dest, digest=project.inputs_digest(), head=head, base=base_commit)
  return head


def tree_changes(tree: Path, stamp: dict[str, str]) -> list[str]:
  """What the developer changed in the tree since it was built or refreshed."""
  changes = []
  head = git_out('rev-parse', 'HEAD', cwd=tree)
  if head != stamp.get('head'):
    changes.append(f'HEAD moved to {head[:12]}')
  dirty = is_dirty(tree)
  if dirty:
    changes.append(f'{len(dirty)} uncommitted changes ({dirty[0].strip()})')
  return changes


def ensure_tree(
    project: Project, force: bool = False, use_local: bool = False) -> Path:
  """Builds build/beam unless it is current; never discards unexported work.

  With use_local (the gates), a tree with unexported work is used as it is,
  so that edits can be tested before they are refreshed into patches/.
  """
  tree = project.tree
  digest = project.inputs_digest()
  stamp = read_stamp(tree) if tree.exists() else None
  if stamp is not None:
    changes = tree_changes(tree, stamp)
    if stamp.get('digest') == digest and not changes:
      print(
          f'beampq: {project.rel(tree)} is up to date '
          f'(HEAD {stamp["head"][:12]})')
      return tree
    if changes and use_local:
      print(
          f'beampq: using {project.rel(tree)} with work not in patches/ '
          f'({"; ".join(changes)})')
      return tree
    if changes and not force:
      raise Error(
          f'{project.rel(tree)} has work that is not in patches/ '
          f'({"; ".join(changes)}): run `beampq refresh` to keep it or '
          '`beampq tree --force` to discard it')
  project.build.mkdir(parents=True, exist_ok=True)
  scratch = Path(tempfile.mkdtemp(prefix='.beam-', dir=project.build))
  try:
    build_tree(project, scratch / 'beam')
    if tree.exists():
      tree.rename(scratch / 'old')
    (scratch / 'beam').rename(tree)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  print(f'beampq: patched tree at {tree}')
  return tree


# --------------------------------------------------------------------------
# refresh: export the tree's commits back to patches/ and sdks/.


def _format_patch(
    tree: Path, commit: str, number: int, out: Path, paths: list[str]) -> Path:
  git(
      'format-patch',
      '-1',
      commit,
      '--quiet',
      '--zero-commit',
      '--no-signature',
      '--full-index',
      f'--start-number={number}',
      '-o',
      str(out),
      '--',
      *paths,
      cwd=tree)
  made = sorted(out.glob(f'{number:04d}-*.patch'))
  if len(made) != 1:
    raise Error(f'git format-patch wrote {len(made)} files for {commit[:12]}')
  return made[0]


def export_queue(tree: Path, base_commit: str, out: Path) -> list[Entry]:
  """Writes the commits base..HEAD as out/patches/*.patch and out/sdks/..."""
  if git('merge-base',
         '--is-ancestor',
         base_commit,
         'HEAD',
         cwd=tree,
         check=False).returncode != 0:
    raise Error(f'{tree} HEAD does not descend from the pristine base')
  if git_out('rev-list', '--merges', f'{base_commit}..HEAD', cwd=tree):
    raise Error(f'{tree} has merge commits; the queue must be linear')
  commits = git_out(
      'rev-list', '--reverse', f'{base_commit}..HEAD', cwd=tree).split()
  upstream = set(
      git_out('ls-tree', '-r', '--name-only', base_commit,
              cwd=tree).split('\n'))
  (out / 'patches').mkdir(parents=True)
  owner: dict[str, str] = {}
  entries = []
  for number, commit in enumerate(commits, 1):
    subject = git_out('log', '-1', '--format=%s', commit, cwd=tree)
    fields = git_out(
        'diff-tree',
        '-r',
        '-z',
        '--no-renames',
        '--no-commit-id',
        '--name-status',
        f'{commit}^',
        commit,
        cwd=tree).split('\0')
    changed = list(zip(fields[0::2], fields[1::2]))
    added = []
    for status, path in changed:
      if path in upstream:
        continue
      if path in owner:
        raise Error(
            f'{path} is added by "{owner[path]}" and changed again by '
            f'"{subject}": fold the change into the commit that adds it '
            f'(git rebase -i {PRISTINE_TAG})')
      if status != 'A' or not path.startswith('sdks/'):
        raise Error(f'"{subject}" adds {path}; new files must be under sdks/')
      owner[path] = subject
      added.append(path)
    modified = [path for _, path in changed if path in upstream]
    if not changed:
      raise Error(f'"{subject}" changes nothing; drop it')
    patch = _format_patch(
        tree, commit, number, out / 'patches', modified or added)
    if not modified:
      # Only new files: keep the message, the files travel in sdks/. Cut
      # before the diffstat too, so that git am keeps an empty commit.
      text = patch.read_text()
      end = text.rindex('\n---\n', 0, text.index('\ndiff --git '))
      patch.write_text(text[:end + 1])
    for path in added:
      target = out / path
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_bytes(_file_blob(tree, commit, path))
    entries.append(Entry(patch.name, added))
  (out / 'patches' / 'series').write_text(format_series(entries))
  return entries


def _file_blob(tree: Path, commit: str, path: str) -> bytes:
  return subprocess.run(['git', 'show', f'{commit}:{path}'],
                        cwd=tree,
                        capture_output=True,
                        check=True).stdout


def refresh(project: Project):
  tree = project.tree
  stamp = read_stamp(tree) if tree.exists() else None
  if stamp is None:
    raise Error(
        f'{project.rel(tree)} is not a tree built by beampq; '
        'run `beampq tree` first')
  in_progress = operation_in_progress(tree)
  if in_progress:
    raise Error(
        f'a {in_progress} is in progress in {project.rel(tree)}; '
        'finish or abort it first')
  dirty = is_dirty(tree)
  if dirty:
    raise Error(
        f'{project.rel(tree)} has uncommitted changes '
        f'({dirty[0].strip()}, ...): commit them first')
  with tempfile.TemporaryDirectory(dir=project.build) as scratch:
    out = Path(scratch)
    entries = export_queue(tree, stamp['base'], out)
    head = git_out('rev-parse', 'HEAD', cwd=tree)
    for old in project.patches.glob('*.patch'):
      old.unlink()
    for patch in (out / 'patches').iterdir():
      shutil.copyfile(patch, project.patches / patch.name)
    if project.sdks.exists():
      shutil.rmtree(project.sdks)
    if (out / 'sdks').exists():
      shutil.copytree(out / 'sdks', project.sdks)
  _write_stamp(
      tree, digest=project.inputs_digest(), head=head, base=stamp['base'])
  for entry in entries:
    extra = f' (+ {len(entry.new_files)} new files)' if entry.new_files else ''
    print(f'beampq: wrote patches/{entry.patch}{extra}')
  print(
      f'beampq: refreshed {len(entries)} patches and '
      f'{sum(len(e.new_files) for e in entries)} new files from '
      f'{project.rel(tree)}')


# --------------------------------------------------------------------------
# check: patches/, sdks/, the series and the tree agree.


def _patched_paths(patch: Path) -> list[str]:
  return re.findall(r'^diff --git a/(\S+) b/', patch.read_text(), re.M)


def check(project: Project):
  problems = []
  entries = project.series()
  listed_new = {path for entry in entries for path in entry.new_files}
  for entry in entries:
    patch = project.patches / entry.patch
    if not patch.is_file():
      problems.append(f'series names patches/{entry.patch}, which is missing')
      continue
    for path in _patched_paths(patch):
      if path in listed_new:
        problems.append(
            f'{entry.patch} changes {path}, a new file of the '
            'series; new files live only in sdks/')
  for patch in sorted(project.patches.glob('*.patch')):
    if patch.name not in {e.patch for e in entries}:
      problems.append(f'patches/{patch.name} is not in the series')
  on_disk = {
      project.rel(path)
      for path in project.sdks.rglob('*') if path.is_file()
  } if project.sdks.exists() else set()
  for path in sorted(listed_new - on_disk):
    problems.append(f'series lists {path}, which is missing')
  for path in sorted(on_disk - listed_new):
    problems.append(f'{path} is not listed in the series')
  try:
    read_changes(project.changes)
  except Error as e:
    problems.append(str(e))
  tree = project.tree
  stamp = read_stamp(tree) if tree.exists() else None
  changes = tree_changes(tree, stamp) if stamp is not None else []
  if changes:
    problems.append(
        f'{project.rel(tree)} has work that is not in patches/ '
        f'({"; ".join(changes)}): run `beampq refresh`')
  if not problems:
    problems.extend(_round_trip(project))
  if problems:
    for problem in problems:
      print(f'beampq: check: {problem}', file=sys.stderr)
    raise Error(f'check found {len(problems)} problems')
  print(
      f'beampq: check: {len(entries)} patches and {len(listed_new)} new '
      'files agree, and a tree built from them exports to the same files')


@contextlib.contextmanager
def queue_tree(project: Project):
  """Yields a tree of the queue as patches/ and sdks/ hold it: build/beam
  when it is current, else a temporary tree (build/beam is left alone)."""
  stamp = read_stamp(project.tree) if project.tree.exists() else None
  if (stamp and stamp.get('digest') == project.inputs_digest() and
      not tree_changes(project.tree, stamp)):
    yield project.tree
    return
  project.build.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=project.build) as scratch:
    tree = Path(scratch) / 'beam'
    build_tree(project, tree, quiet=True)
    yield tree


def _round_trip(project: Project) -> list[str]:
  """Builds the queue and exports it again: the files must not change."""
  with queue_tree(project) as tree, tempfile.TemporaryDirectory() as scratch:
    base_commit = git_out('rev-parse', PRISTINE_TAG, cwd=tree)
    out = Path(scratch) / 'export'
    entries = export_queue(tree, base_commit, out)
    problems = []
    if (out / 'patches' / 'series').read_bytes() != _read_bytes(
        project.series_file):
      problems.append(
          'patches/series is stale: the tree exports it as ' +
          ', '.join(e.patch for e in entries))
    for entry in entries:
      exported = (out / 'patches' / entry.patch).read_bytes()
      ours = project.patches / entry.patch
      if ours.is_file() and ours.read_bytes() != exported:
        problems.append(
            f'patches/{entry.patch} is stale: run `beampq tree` '
            'and `beampq refresh`')
    return problems


# --------------------------------------------------------------------------
# CHANGES.md: our entries, in Beam's format, and inserting them upstream.


def read_changes(path: Path) -> dict[str, list[str]]:
  """Returns {heading: [entry]} of the top Unreleased section of path."""
  if not path.is_file():
    raise Error(f'{path.name} is missing')
  return read_changes_text(path.read_text(), path.name)


def read_changes_text(text: str,
                      name: str = 'CHANGES.md') -> dict[str, list[str]]:
  lines = text.splitlines()
  start = next(
      (i for i, line in enumerate(lines) if CHANGES_HEADING.match(line)), None)
  if start is None:
    raise Error(f'{name} has no "# [x.y.z] - Unreleased" section')
  sections: dict[str, list[str]] = {}
  heading = None
  for lineno, line in enumerate(lines[start + 1:], start + 2):
    if line.startswith('# '):
      break
    if line.startswith('## '):
      heading = line[3:].strip()
      sections.setdefault(heading, [])
    elif line.startswith('* '):
      if heading is None:
        raise Error(f'{name}:{lineno}: entry before any "## " heading')
      sections[heading].append(line)
    elif line.startswith('  ') and heading and sections[heading]:
      sections[heading][-1] += '\n' + line
  entries = {
      h: [e for e in es if PLACEHOLDER not in e]
      for h, es in sections.items()
  }
  for heading, items in entries.items():
    for entry in items:
      if not re.search(
          r'\(\[#\d+\]\(https://github\.com/apache/beam/(issues|pull)/\d+\)'
          r'\)\.$',
          entry):
        raise Error(
            f'{name}: entry under "{heading}" does not end with '
            'a ([#N](https://github.com/apache/beam/issues/N)). link: '
            f'{entry[:60]}...')
  return {h: es for h, es in entries.items() if es}


def insert_changes(text: str, entries: dict[str, list[str]]) -> tuple[str, int]:
  """Adds entries under their headings in the top Unreleased section."""
  lines = text.splitlines()
  start = next(
      (i for i, line in enumerate(lines) if CHANGES_HEADING.match(line)), None)
  if start is None:
    raise Error('CHANGES.md has no "# [x.y.z] - Unreleased" section')
  end = next(
      (i for i in range(start + 1, len(lines)) if lines[i].startswith('# ')),
      len(lines))
  added = 0
  for heading, items in entries.items():
    at = next((
        i
        for i in range(start + 1, end) if lines[i].strip() == f'## {heading}'),
              None)
    if at is None:
      lines[end:end] = [f'## {heading}', '']
      at, end = end, end + 2
    stop = next((i for i in range(at + 1, end) if lines[i].startswith('#')),
                end)
    block = '\n'.join(lines[at + 1:stop])
    bullets = [i for i in range(at + 1, stop) if lines[i].startswith('* ')]
    new = [item for item in items if item not in block]
    if not new:
      continue
    real, placeholders = [], []
    i = bullets[0] if bullets else None
    last = at
    while i is not None and i < stop:
      if lines[i].startswith('* '):
        j = i + 1
        while j < stop and lines[j].startswith('  '):
          j += 1
        entry = '\n'.join(lines[i:j])
        (placeholders if PLACEHOLDER in entry else real).append(entry)
        last = j - 1
        i = j
      elif lines[i].strip() == '':
        i += 1
      else:
        break
    keep = placeholders if heading == 'Bugfixes' else []
    replacement = '\n'.join(real + new + keep).split('\n')
    if bullets:
      lines[bullets[0]:last + 1] = replacement
      delta = len(replacement) - (last + 1 - bullets[0])
    else:
      lines[at + 1:at + 1] = [''] + replacement + ([''] if (
          at + 1 < len(lines) and lines[at + 1].strip()) else [])
      delta = len(replacement) + 1
    end += delta
    added += len(new)
  return '\n'.join(lines) + '\n', added


def changes_text(entries: dict[str, list[str]]) -> str:
  return '\n'.join(
      f'## {heading}\n\n' + '\n'.join(items) + '\n'
      for heading, items in entries.items())


# --------------------------------------------------------------------------
# apply and export.


def _full_series(tree: Path, out: Path, numbered: bool) -> list[Path]:
  base_commit = git_out('rev-parse', PRISTINE_TAG, cwd=tree)
  git(
      'format-patch',
      '--quiet',
      '--zero-commit',
      '--no-signature',
      '--full-index',
      '--numbered' if numbered else '--no-numbered',
      '-o',
      str(out),
      f'{base_commit}..HEAD',
      cwd=tree)
  return sorted(out.glob('*.patch'))


def apply(project: Project, checkout: Path):
  checkout = checkout.resolve()
  if not checkout.is_dir():
    raise Error(f'{checkout} is not a directory')
  top = git('rev-parse', '--show-toplevel', cwd=checkout, check=False)
  if top.returncode != 0 or Path(top.stdout.strip()).resolve() != checkout:
    raise Error(f'{checkout} is not the top of a git checkout')
  if not (checkout / project.base.subdir / 'apache_beam' /
          '__init__.py').is_file():
    raise Error(
        f'{checkout} is not a Beam checkout: it has no '
        f'{project.base.subdir}/apache_beam package')
  in_progress = operation_in_progress(checkout)
  if in_progress:
    raise Error(f'a {in_progress} is in progress in {checkout}')
  dirty = is_dirty(checkout, isolated=False)
  if dirty:
    raise Error(
        f'{checkout} has uncommitted changes ({dirty[0].strip()}, '
        '...): commit or stash them first')
  entries = read_changes(project.changes)
  original = git_out('rev-parse', 'HEAD', cwd=checkout, isolated=False)
  with queue_tree(project) as tree, tempfile.TemporaryDirectory() as scratch:
    patches = _full_series(tree, Path(scratch), numbered=False)
    try:
      for patch in patches:
        result = git(
            'am',
            '-3',
            '--quiet',
            '--keep-non-patch',
            '--empty=keep',
            str(patch),
            cwd=checkout,
            isolated=False,
            check=False)
        if result.returncode != 0:
          output = result.stdout + result.stderr
          where = re.findall(
              r'(?:patch failed: |CONFLICT \(content\): Merge conflict in )'
              r'(\S+)',
              output)
          raise Error(
              f'{patch.name} does not apply to {checkout}'
              f'{": " + where[0] if where else ""} (git am -3 failed; the '
              'checkout is left as it was)')
      changes = checkout / 'CHANGES.md'
      note = 'no CHANGES.md there, so no entries added'
      if changes.is_file():
        text, added = insert_changes(changes.read_text(), entries)
        if added:
          changes.write_text(text)
          git('add', 'CHANGES.md', cwd=checkout, isolated=False)
          git(
              'commit',
              '-q',
              '-m',
              'Add CHANGES.md entries for prefix-aware batching',
              cwd=checkout,
              isolated=False)
        note = f'CHANGES.md: {added} entries added to the Unreleased section'
    except BaseException:
      git('am', '--abort', cwd=checkout, isolated=False, check=False)
      git('reset', '-q', '--hard', original, cwd=checkout, isolated=False)
      raise
  for patch in patches:
    print(f'beampq: applied {patch.name}')
  print(f'beampq: {checkout}: {len(patches)} patches applied; {note}')


def export(project: Project, dest: Path, squash: bool):
  dest = dest.resolve()
  if dest.exists():
    raise Error(f'{dest} already exists; export writes a new folder')
  entries = read_changes(project.changes)
  dest.parent.mkdir(parents=True, exist_ok=True)
  scratch = Path(tempfile.mkdtemp(prefix='.export-', dir=dest.parent))
  try:
    out = scratch / 'out'
    out.mkdir()
    with queue_tree(project) as built:
      tree = scratch / 'beam'
      git('clone', '-q', str(built), str(tree), cwd=scratch)
    if squash:
      _squash(project, tree)
    _full_series(tree, out, numbered=not squash)
    (out / 'CHANGES-entries.md').write_text(changes_text(entries))
    out.rename(dest)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  for path in sorted(dest.iterdir()):
    print(f'beampq: wrote {path}')
  print(
      f'beampq: apply with `git am -3 {dest}/*.patch` in a Beam checkout; '
      'CHANGES-entries.md holds the CHANGES.md entries')


def _squash(project: Project, clone: Path):
  """Squashes the queue in clone into one commit with the pull request's
  title (first line of patches/pull-request.md) and description."""
  title, _, body = project.pull_request.read_text().partition('\n')
  first = git_out(
      'rev-list', '--reverse', f'{PRISTINE_TAG}..HEAD', cwd=clone).split()[0]
  name, email, date = git_out(
      'log', '-1', '--format=%an%n%ae%n%aI', first, cwd=clone).split('\n')
  git('reset', '-q', '--soft', PRISTINE_TAG, cwd=clone)
  git(
      'commit',
      '-q',
      '-m',
      title.lstrip('#').strip() + '\n\n' + body.strip() + '\n',
      cwd=clone,
      env=dict(
          TOOL_IDENTITY,
          GIT_AUTHOR_NAME=name,
          GIT_AUTHOR_EMAIL=email,
          GIT_AUTHOR_DATE=date))


# --------------------------------------------------------------------------
# Gates on the patched tree: tests, lint, pylint, mypy, format.


def touched(tree: Path) -> tuple[list[str], list[str]]:
  """The upstream files the tree changes and the files it adds, uncommitted
  work included."""
  changed = git_out(
      'diff', '--name-status', '--no-renames', PRISTINE_TAG,
      cwd=tree).splitlines()
  untracked = git_out(
      'ls-files', '--others', '--exclude-standard', cwd=tree).splitlines()
  modified = sorted(
      line.split('\t', 1)[1] for line in changed if line[0] in 'MT')
  added = sorted([line.split('\t', 1)[1]
                  for line in changed if line[0] == 'A'] + untracked)
  return modified, added


def _package_paths(project: Project, paths: Iterable[str]) -> list[str]:
  """Tree paths of Python files, relative to the sdk folder."""
  prefix = project.base.subdir + '/'
  return [
      p[len(prefix):] for p in paths
      if p.startswith(prefix) and p.endswith('.py')
  ]


def _yapf_paths(files: Iterable[str]) -> list[str]:
  """The files Beam formats with yapf: its package, not setup.py."""
  return [f for f in files if f.startswith('apache_beam/')]


def ensure_pristine(project: Project, tree: Path) -> Path:
  """A cached copy of the pristine sdk folder, for ratchets."""
  base_commit = git_out('rev-parse', PRISTINE_TAG, cwd=tree)
  marker = project.pristine / '.base'
  if marker.is_file() and marker.read_text() == base_commit:
    return project.pristine / project.base.subdir
  shutil.rmtree(project.pristine, ignore_errors=True)
  project.pristine.mkdir(parents=True)
  archive = subprocess.run(['git', 'archive', '--format=tar', base_commit],
                           cwd=tree,
                           capture_output=True,
                           check=True).stdout
  with tempfile.TemporaryFile() as buffer:
    buffer.write(archive)
    buffer.seek(0)
    with tarfile.open(fileobj=buffer) as tar:
      tar.extractall(project.pristine, filter='data')
  marker.write_text(base_commit)
  return project.pristine / project.base.subdir


def pytest_on(
    project: Project,
    sdk: Path,
    targets: list[str],
    failed: Optional[list[str]] = None) -> int:
  """Runs Beam's pytest setup in an sdk folder: the tests in parallel, then
  the no_xdist ones alone. Adds the ids of failed tests to failed."""
  env = dict(
      os.environ,
      PYTHONPATH=os.pathsep.join([str(sdk), str(Path(__file__).parent)]),
      BEAMPQ_TREE=str(sdk))
  common = [
      sys.executable,
      '-m',
      'pytest',
      '-p',
      'beam_pytest_plugin',
      '--import-mode=importlib',
      '-o',
      'python_classes=',
      '-o',
      'python_functions=',
      '-o',
      'python_files=test_*.py *_test.py *_test_py3*.py *_test_it.py',
      '-o',
      'timeout=600',
      '-o',
      'cache_dir=' + str(project.build / 'pytest-cache'),
      '-rfEs',
  ]
  codes = []
  for marker, parallel in (('not no_xdist', ['-n', '2']), ('no_xdist', [])):
    print(f'beampq: pytest -m "{marker}" in {sdk}', flush=True)
    with subprocess.Popen(common + parallel + ['-m', marker] + targets,
                          cwd=sdk,
                          env=env,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          text=True) as run:
      for line in run.stdout:
        print(line, end='', flush=True)
        match = re.match(r'^(?:FAILED|ERROR) (\S+)', line)
        if match and failed is not None:
          failed.append(match.group(1))
    codes.append(run.returncode)
  if all(code == 5 for code in codes):
    print('beampq: no tests were collected')
    return 0
  return next((code for code in codes if code not in (0, 5)), 0)


def run_tests(project: Project, pytest_args: list[str]) -> int:
  tree = ensure_tree(project, use_local=True)
  modified, new = touched(tree)
  modules = [
      p for p in _package_paths(project, modified + new)
      if p.endswith('_test.py')
  ]
  targets = pytest_args or modules
  print(f'beampq: test modules: {" ".join(targets)}')
  return pytest_on(project, tree / project.base.subdir, targets)


# Test folders that exercise BatchElements and RunInference as a whole.
REGRESSION_FOLDERS = ('apache_beam/transforms', 'apache_beam/ml/inference')


def regression_modules(sdk: Path) -> list[str]:
  """The test modules of REGRESSION_FOLDERS, plus the tests of every module
  (examples aside) that uses BatchElements."""
  modules = {
      str(path.relative_to(sdk))
      for folder in REGRESSION_FOLDERS
      for path in (sdk / folder).rglob('*_test.py')
  }
  for path in (sdk / 'apache_beam').rglob('*.py'):
    if 'examples' in path.parts or path.name.endswith('_test.py'):
      continue
    test = path.with_name(path.stem + '_test.py')
    if test.exists() and 'BatchElements' in path.read_text(errors='replace'):
      modules.add(str(test.relative_to(sdk)))
  return sorted(modules)


def classify_failures(
    failed: list[str], failed_again: list[str],
    failed_before: list[str]) -> dict[str, list[str]]:
  """Sorts the tests that failed on the patched tree by what their reruns
  did: failed on the pristine base too, passed on a rerun, or neither."""
  return {
      'also fails on the pristine base': [
          t for t in failed if t in failed_before
      ],
      'flaky: passed when rerun': [
          t for t in failed if t not in failed_before and t not in failed_again
      ],
      'NEW': [
          t for t in failed if t not in failed_before and t in failed_again
      ],
  }


def regression(project: Project, pytest_args: list[str]) -> int:
  """Runs the wider suites on the patched tree; failures that also occur on
  the pristine base are listed as such, and only new ones fail the run."""
  tree = ensure_tree(project, use_local=True)
  sdk = tree / project.base.subdir
  pristine = ensure_pristine(project, tree)
  targets = pytest_args or regression_modules(sdk)
  print(f'beampq: regression: {len(targets)} test modules: {" ".join(targets)}')
  started = time.monotonic()
  failed: list[str] = []
  code = pytest_on(project, sdk, targets, failed)
  if code not in (0, 1):
    raise Error(f'pytest exited with {code} on the patched tree')
  files = sorted({test.split('::')[0] for test in failed})
  failed_again: list[str] = []
  failed_before: list[str] = []
  if files:
    print(
        f'beampq: rerunning the {len(files)} files with failures on the '
        'patched tree and on the pristine base',
        flush=True)
    pytest_on(project, sdk, files, failed_again)
    pytest_on(
        project,
        pristine, [f for f in files if (pristine / f).is_file()],
        failed_before)
  verdicts = classify_failures(failed, failed_again, failed_before)
  minutes = (time.monotonic() - started) / 60
  print(
      f'beampq: regression: {len(targets)} modules in {minutes:.1f} min; '
      f'{len(failed)} failures on the patched tree: ' + ', '.join(
          f'{len(tests)} {verdict}' for verdict, tests in verdicts.items()))
  for verdict, tests in verdicts.items():
    for test in tests:
      print(f'  {verdict}: {test}')
  return 1 if verdicts['NEW'] else 0


@dataclasses.dataclass(frozen=True)
class Finding:
  path: str
  line: int
  code: str
  message: str

  def key(self):
    return (self.path, self.code, re.sub(r'\(line \d+\)', '', self.message))

  def __str__(self):
    return f'{self.path}:{self.line}: {self.code} {self.message}'


def ratchet(tool: str, before: list[Finding], after: list[Finding]) -> bool:
  """Reports findings the patches add; True when there are none."""
  remaining = collections.Counter(f.key() for f in before)
  added = []
  for finding in sorted(after, key=lambda f: (f.path, f.line)):
    if remaining[finding.key()] > 0:
      remaining[finding.key()] -= 1
    else:
      added.append(finding)
  print(
      f'beampq: {tool}: {len(before)} findings on the pristine base, '
      f'{len(after)} on the patched tree, {len(added)} added')
  for finding in added:
    print(f'  {finding}')
  return not added


def _tool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', *args],
                        cwd=cwd,
                        capture_output=True,
                        text=True,
                        check=False)


def yapf_diff(sdk: Path, files: list[str]) -> str:
  if not files:
    return ''
  diff = _tool('yapf', '--diff', *files, cwd=sdk)
  if diff.returncode not in (0, 1) or diff.stderr.strip():
    raise Error(f'yapf failed: {diff.stderr.strip()[-300:]}')
  return diff.stdout


def ruff_findings(sdk: Path, files: list[str]) -> list[Finding]:
  files = [f for f in files if (sdk / f).is_file()]
  if not files:
    return []
  result = _tool(
      'ruff',
      'check',
      '--no-cache',
      '--force-exclude',
      '--output-format=json',
      *files,
      cwd=sdk)
  if result.returncode not in (0, 1):
    raise Error(f'ruff failed: {result.stderr.strip()}')
  return [
      Finding(
          os.path.relpath(item['filename'], sdk),
          item['location']['row'],
          item['code'] or 'syntax',
          item['message']) for item in json.loads(result.stdout)
  ]


def pyrefly_findings(sdk: Path) -> list[Finding]:
  result = _tool(
      'pyrefly',
      'check',
      '--output-format=json',
      str(sdk / 'apache_beam'),
      cwd=sdk)
  try:
    errors = json.loads(result.stdout)['errors']
  except (ValueError, KeyError):
    raise Error(f'pyrefly failed: {(result.stderr or result.stdout)[-300:]}')
  return [
      Finding(
          os.path.relpath(item['path'], sdk),
          item['line'],
          item['name'],
          item['description']) for item in errors
  ]


def pylint_findings(sdk: Path, files: list[str]) -> list[Finding]:
  files = [f for f in files if (sdk / f).is_file()]
  rcfile = Path(__file__).parent / 'pylintrc'
  result = _tool(
      'pylint',
      f'--rcfile={rcfile}',
      '--output-format=json',
      '--jobs=2',
      *files,
      cwd=sdk)
  if result.returncode & 32 or not result.stdout.strip():
    raise Error(f'pylint failed: {result.stderr.strip()[-300:]}')
  return [
      Finding(item['path'], item['line'], item['symbol'], item['message'])
      for item in json.loads(result.stdout)
  ]


def mypy_findings(sdk: Path, files: list[str], cache: Path) -> list[Finding]:
  files = [f for f in files if (sdk / f).is_file()]
  config = Path(__file__).parent / 'mypy.ini'
  result = _tool(
      'mypy',
      f'--config-file={config}',
      f'--cache-dir={cache}',
      '--no-error-summary',
      '--no-color-output',
      '--show-error-codes',
      *files,
      cwd=sdk)
  if result.returncode not in (0, 1):
    raise Error(f'mypy failed: {(result.stderr or result.stdout)[-300:]}')
  findings = []
  for line in result.stdout.splitlines():
    match = re.match(
        r'^(.+?):(\d+):(?:\d+:)? error: (.*?)(?:  \[([\w-]+)\])?$', line)
    if match and match.group(1) in files:
      findings.append(
          Finding(
              match.group(1),
              int(match.group(2)),
              match.group(4) or 'error',
              match.group(3)))
  return findings


def unittest_main_problems(sdk: Path, files: list[str]) -> list[str]:
  problems = []
  for name in files:
    text = (sdk / name).read_text()
    if re.search(r'^import unittest$', text,
                 re.M) and 'unittest.main' not in text:
      problems.append(f'{name} imports unittest but never calls unittest.main')
  return problems


def lint(project: Project) -> int:
  tree = ensure_tree(project, use_local=True)
  sdk = tree / project.base.subdir
  pristine = ensure_pristine(project, tree)
  modified, new = touched(tree)
  changed = _package_paths(project, modified)
  added = _package_paths(project, new)
  files = changed + added
  if not files:
    print('beampq: lint: the queue touches no Python files')
    return 0
  ok = ratchet(
      'ruff', ruff_findings(pristine, changed), ruff_findings(sdk, files))
  formatted = _yapf_paths(files)
  diff = yapf_diff(sdk, formatted)
  print(
      f'beampq: yapf --diff on {len(formatted)} files: '
      f'{"clean" if not diff.strip() else "needs formatting"}')
  if diff.strip():
    print(diff)
    ok = False
  problems = unittest_main_problems(sdk, files)
  print(
      f'beampq: unittest.main check on {len(files)} files: '
      f'{len(problems)} problems')
  for problem in problems:
    print(f'  {problem}')
  ok = ratchet(
      'pyrefly', pyrefly_findings(pristine),
      pyrefly_findings(sdk)) and ok and not problems
  return 0 if ok else 1


def pylint(project: Project) -> int:
  tree = ensure_tree(project, use_local=True)
  pristine = ensure_pristine(project, tree)
  modified, new = touched(tree)
  changed = _package_paths(project, modified)
  files = changed + _package_paths(project, new)
  before = pylint_findings(pristine, changed)
  after = pylint_findings(tree / project.base.subdir, files)
  return 0 if ratchet('pylint', before, after) else 1


def mypy(project: Project) -> int:
  tree = ensure_tree(project, use_local=True)
  pristine = ensure_pristine(project, tree)
  modified, new = touched(tree)
  changed = _package_paths(project, modified)
  files = changed + _package_paths(project, new)
  cache = project.build / 'mypy-cache'
  before = mypy_findings(pristine, changed, cache / 'pristine')
  after = mypy_findings(tree / project.base.subdir, files, cache / 'patched')
  return 0 if ratchet('mypy', before, after) else 1


def format_tree(project: Project) -> int:
  """yapf on the touched files; ruff's import sorting where the base had none
  to fix, so that patches do not carry unrelated import churn."""
  tree = ensure_tree(project, use_local=True)
  sdk = tree / project.base.subdir
  modified, new = touched(tree)
  files = [
      f for f in _package_paths(project, modified + new) if (sdk / f).is_file()
  ]
  unsorted_before = {
      f.path
      for f in ruff_findings(
          ensure_pristine(project, tree), _package_paths(project, modified))
      if f.code == 'I001'
  }
  sortable = [f for f in files if f not in unsorted_before]
  for args, targets in ((('yapf', '--in-place'), _yapf_paths(files)),
                        (('ruff', 'check', '--no-cache', '--select=I', '--fix',
                          '--quiet'), sortable)):
    if not targets:
      continue
    result = _tool(*args, *targets, cwd=sdk)
    if result.returncode not in (0, 1):
      raise Error(f'{args[0]} failed: {result.stderr.strip()[-300:]}')
  changed = is_dirty(tree)
  print(
      f'beampq: formatted {len(files)} files; {len(changed)} changed in '
      f'{project.rel(tree)}' +
      (': commit them there and run `beampq refresh`' if changed else ''))
  return 0


# --------------------------------------------------------------------------
# Command line.


def main(argv: Optional[list[str]] = None) -> int:
  parser = argparse.ArgumentParser(
      prog='beampq', description=__doc__.split('\n\n')[0])
  parser.add_argument(
      '--project',
      type=Path,
      default=ROOT,
      help='the patch-set repository (default: the one holding this script)')
  commands = parser.add_subparsers(dest='command', required=True)
  fetch_cmd = commands.add_parser('fetch', help='download and verify the base')
  fetch_cmd.add_argument(
      '--from',
      dest='source',
      type=Path,
      help='use this local copy of the sdist instead of the index')
  tree_cmd = commands.add_parser('tree', help='build build/beam')
  tree_cmd.add_argument(
      '--force',
      action='store_true',
      help='rebuild even if build/beam has work not in patches/')
  commands.add_parser('refresh', help='write patches/ and sdks/ from the tree')
  commands.add_parser('check', help='fail when the queue is inconsistent')
  apply_cmd = commands.add_parser('apply', help='apply to a Beam checkout')
  apply_cmd.add_argument('checkout', type=Path)
  export_cmd = commands.add_parser('export', help='write patches for upstream')
  export_cmd.add_argument('dest', type=Path)
  export_cmd.add_argument(
      '--squash',
      action='store_true',
      help='one patch with the pull request title and description')
  test_cmd = commands.add_parser('test', help='pytest on the patched tree')
  test_cmd.add_argument('pytest_args', nargs=argparse.REMAINDER)
  regression_cmd = commands.add_parser(
      'regression', help='the wider suites, compared with the pristine base')
  regression_cmd.add_argument('pytest_args', nargs=argparse.REMAINDER)
  for name in ('lint', 'pylint', 'mypy', 'format'):
    commands.add_parser(name, help=f'{name} on the files the queue touches')
  args = parser.parse_args(argv)
  try:
    project = Project(args.project)
    if args.command == 'fetch':
      fetch(project, args.source)
    elif args.command == 'tree':
      ensure_tree(project, force=args.force)
    elif args.command == 'refresh':
      refresh(project)
    elif args.command == 'check':
      check(project)
    elif args.command == 'apply':
      apply(project, args.checkout)
    elif args.command == 'export':
      export(project, args.dest, args.squash)
    elif args.command in ('test', 'regression'):
      extra = [a for a in args.pytest_args if a != '--']
      run = run_tests if args.command == 'test' else regression
      return run(project, extra)
    else:
      return {
          'lint': lint, 'pylint': pylint, 'mypy': mypy, 'format': format_tree
      }[args.command](
          project)
  except Error as e:
    print(f'beampq: error: {e}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
