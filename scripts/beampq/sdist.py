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

"""The pinned base: the sdist, found through the package index pip uses,
downloaded once into build/cache and refused unless its sha256 matches."""

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
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

from beampq import Error
from beampq.project import Base
from beampq.project import Project


def _pip_config() -> dict[str, str]:
  """`pip config list`: pip's settings from its files and environment."""
  try:
    listed = subprocess.run([sys.executable, '-m', 'pip', 'config', 'list'],
                            capture_output=True,
                            text=True,
                            timeout=120,
                            check=False)
  except (OSError, subprocess.SubprocessError):
    return {}
  settings = {}
  for line in listed.stdout.splitlines():
    key, sep, value = line.partition('=')
    if sep:
      settings[key.strip()] = value.strip().strip('\'"')
  return settings


def _pip_default_index() -> str:
  """The index pip uses when nothing configures one, as pip defines it."""
  try:
    from pip._internal.models.index import PyPI
  except ImportError:
    raise Error(
        'pip is not importable here, so its default index is unknown: set '
        'PIP_INDEX_URL') from None
  return PyPI.simple_url


def index_url() -> str:
  """The index pip would install from: PIP_INDEX_URL, then pip's
  configuration (its `download` section before `global`), then pip's own
  default."""
  from_env = os.environ.get('PIP_INDEX_URL', '').split()
  if from_env:
    return from_env[0]
  settings = _pip_config()
  for key in (':env:.index-url', 'download.index-url', 'global.index-url'):
    if settings.get(key, '').split():
      return settings[key].split()[0]
  return _pip_default_index()


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
  if source is not None and not source.is_file():
    raise Error(f'{source} does not exist')
  if target.exists():
    actual = sha256_of(target)
    if actual == base.sha256:
      if source is None:
        return target
    else:
      # Moved aside, not deleted: a mistyped pin would otherwise cost a
      # machine without the index its only copy of the release.
      aside = target.with_name(f'{target.name}.sha256-{actual[:12]}')
      target.replace(aside)
      print(
          f'beampq: moved cached {project.rel(target)} to '
          f'{project.rel(aside)}: sha256 {actual} is not the pinned '
          f'{base.sha256} (if the pin is wrong, fix it and run `python3 -m '
          f'beampq fetch --from {project.rel(aside)}`)',
          file=sys.stderr)
  project.cache.mkdir(parents=True, exist_ok=True)
  # A name of its own, so that two fetches at once (tests on two cores) do
  # not write one file; the verified one is renamed into place.
  handle, name = tempfile.mkstemp(
      dir=project.cache, prefix=f'{base.filename}.', suffix='.part')
  os.close(handle)
  partial = Path(name)
  try:
    return _fetch_into(project, base, source, partial, target)
  finally:
    partial.unlink(missing_ok=True)


def _fetch_into(
    project: Project,
    base: Base,
    source: Optional[Path],
    partial: Path,
    target: Path) -> Path:
  if source is not None:
    origin = str(source)
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
      reason = getattr(e, 'reason', e)
      raise Error(f'cannot download {url}: {reason}') from None
  actual = sha256_of(partial)
  if actual != base.sha256:
    raise Error(
        f'{base.filename} from {origin} has sha256 {actual}, not the pinned '
        f'{base.sha256}; refusing it')
  # mkstemp made it private; the release is not.
  partial.chmod(0o644)
  partial.replace(target)
  print(f'beampq: {project.rel(target)} verified (sha256 {actual[:12]}...)')
  return target


def extract(tarball: Path, dest: Path) -> int:
  """Extracts the sdist's single top folder into dest; returns the time of
  its newest file (seconds since the epoch), the date of the release."""
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
  return max(int(m.mtime) for m in members)
