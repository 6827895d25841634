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

"""The tests the queue adds or changes, read from the syntax trees of each
test module on the base and on the patched tree.

A selection maps a test module (relative to the sdk folder) to what runs of
it: ALL for the whole module, or {test class name: ALL or test names}. A
name also selects what parameterized makes of it: a test name the tests
`name_0_...` that parameterized.expand makes, a class name the classes
`Name_0...` of parameterized_class. Only unittest classes count, as in the
test gate's pytest setup.

Comments and formatting do not count: two definitions are the same when
their syntax trees are. What a change reaches is worked out conservatively,
at the level of the module, then of the class:
- a module the queue adds runs whole, and so does one in which anything
  outside its test classes (and its main block) changes in a way existing
  tests could see: an import, function, helper class or statement changed
  or removed, a new one that binds a name the base already had, or a new
  statement other than an assignment to new names or an import guarded for
  a missing module;
- a test class (one with test methods, or whose bases end in TestCase or
  are test classes of the module) whose bases, decorators, attributes or
  other methods (setUp, a helper) change runs whole, and so do its
  subclasses in the module;
- otherwise a test class runs the tests it adds or changes, and those it
  inherits from a class of the module that adds or changes them.
"""

import ast
from pathlib import Path
from typing import Optional
from typing import Union

ALL = '*'

Tests = Union[str, list[str]]
Selection = dict[str, Union[str, dict[str, Tests]]]


def _is_test(name: str) -> bool:
  return name.startswith('test')


def _is_main_block(node: ast.stmt) -> bool:
  if not isinstance(node, ast.If):
    return False
  test = ast.dump(node.test)
  return "Name(id='__name__'" in test and "Constant(value='__main__')" in test


def _imports(node: ast.stmt) -> dict[str, str]:
  """{bound name: what it is bound to} of an import statement."""
  bound = {}
  assert isinstance(node, (ast.Import, ast.ImportFrom))
  for alias in node.names:
    if isinstance(node, ast.Import):
      # `import a.b` binds a, but imports a.b too: keyed by the dotted name,
      # swapping it for `import a.c` is a change.
      bound[alias.asname or alias.name] = alias.name
    else:
      name = alias.asname or alias.name
      bound[name] = f'{"." * node.level}{node.module or ""}:{alias.name}'
  return bound


def _stored_names(node: ast.AST) -> set[str]:
  """The names a statement binds: by assignment, and by the imports and
  definitions in it (those of a try block that guards an import)."""
  names = {
      name.id
      for name in ast.walk(node)
      if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Store)
  }
  for part in ast.walk(node):
    if isinstance(part, (ast.Import, ast.ImportFrom)):
      names.update(name.split('.')[0] for name in _imports(part))
    elif isinstance(part,
                    (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(part.name)
  return names


# Module-level functions that unittest or pytest call around every test of
# the module.
_MODULE_HOOKS = frozenset((
    'setUpModule',
    'tearDownModule',
    'load_tests',
    'setup_module',
    'teardown_module'))

# What a guarded import catches when its module is not installed.
_IMPORT_ERRORS = frozenset(('ImportError', 'ModuleNotFoundError'))


def _guarded_import(node: ast.stmt) -> bool:
  """Whether a statement is an import guarded for a missing module: a try
  block of imports whose handlers catch only ImportError and bind names.
  It does what a new import does (which binds names, and runs what
  importing runs), with a stand-in for each name when the module is
  missing."""
  if not isinstance(node, ast.Try) or node.orelse or node.finalbody:
    return False
  if not all(isinstance(part, (ast.Import, ast.ImportFrom))
             for part in node.body):
    return False
  for handler in node.handlers:
    caught = handler.type
    names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
    if not names or not all(
        isinstance(name, ast.Name) and name.id in _IMPORT_ERRORS
        for name in names):
      return False
    if handler.name or not all(_only_binds(part) or isinstance(part, ast.Pass)
                               for part in handler.body):
      return False
  return True


def _only_binds(node: ast.stmt) -> bool:
  """Whether a statement does nothing but bind names: a function
  definition that is neither a module hook nor a pytest fixture (an autouse
  one runs around every test), an assignment to plain names, or a guarded
  import (_guarded_import)."""
  if _guarded_import(node):
    return True
  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
    fixture = any(
        'fixture' in ast.unparse(decorator)
        for decorator in node.decorator_list)
    return not fixture and node.name not in _MODULE_HOOKS
  if isinstance(node, ast.Assign):
    targets = node.targets
  elif isinstance(node, ast.AnnAssign):
    targets = [node.target]
  else:
    return False
  return all(isinstance(target, ast.Name) for target in targets)


class _ClassShape:
  """A class as the comparison sees it: its own parts apart from its
  methods, and each method's syntax tree."""
  def __init__(self, node: ast.ClassDef):
    self.bases = [ast.unparse(base) for base in node.bases]
    own = [
        ast.dump(part)
        for part in node.bases + node.keywords + node.decorator_list
    ]
    self.methods: dict[str, str] = {}
    for part in node.body:
      if isinstance(part, (ast.FunctionDef, ast.AsyncFunctionDef)):
        self.methods[part.name] = ast.dump(part)
      else:
        own.append(ast.dump(part))
    self.own = own
    self.dump = ast.dump(node)

  def helpers(self) -> dict[str, str]:
    return {n: d for n, d in self.methods.items() if not _is_test(n)}


class _ModuleShape:
  """A test module's imports, test classes and other module-level code."""
  def __init__(self, source: str):
    self.imports: dict[str, str] = {}
    classes: dict[str, _ClassShape] = {}
    # Everything else at module level: {syntax tree: the names it binds}.
    self.other: dict[str, set[str]] = {}
    # The syntax trees of those that do nothing but bind them.
    self.only_binding: set[str] = set()
    for node in ast.parse(source).body:
      if _is_main_block(node):
        continue
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        self.imports.update(_imports(node))
      elif isinstance(node, ast.ClassDef):
        classes[node.name] = _ClassShape(node)
      else:
        dump = ast.dump(node)
        names = ({node.name} if isinstance(
            node,
            (ast.FunctionDef, ast.AsyncFunctionDef)) else _stored_names(node))
        self.other[dump] = names
        if _only_binds(node):
          self.only_binding.add(dump)
    tests = {
        name
        for name, shape in classes.items()
        if any(_is_test(m) for m in shape.methods) or any(
            base.endswith('TestCase') for base in shape.bases)
    }
    grew = True
    while grew:
      grew = False
      for name, shape in classes.items():
        if name not in tests and tests.intersection(shape.bases):
          tests.add(name)
          grew = True
    self.classes = {n: s for n, s in classes.items() if n in tests}
    self.helper_classes = {
        n: s.dump
        for n, s in classes.items() if n not in tests
    }
    self.names = ({name.split('.')[0]
                   for name in self.imports} | set(classes)
                  | set().union(*self.other.values()))

  def reaches_old_tests(self, base: '_ModuleShape') -> bool:
    """Whether this module's code outside its test classes, against base's,
    can change what a test that is in both does."""
    if any(self.imports.get(n) != b for n, b in base.imports.items()):
      return True
    if any(self.helper_classes.get(n) != d
           for n, d in base.helper_classes.items()):
      return True
    if any(statement not in self.other for statement in base.other):
      return True
    added = [n.split('.')[0] for n in self.imports if n not in base.imports]
    added += [n for n in self.helper_classes if n not in base.helper_classes]
    added += [n for n in self.classes if n not in base.classes]
    for statement, names in self.other.items():
      if statement in base.other:
        continue
      if statement not in self.only_binding:
        return True
      added += names
    # A star import may bind any name of the base's.
    return '*' in added or any(name in base.names for name in added)


def _changed(base: dict[str, str], tree: dict[str, str]) -> list[str]:
  return [name for name in tree if base.get(name) != tree[name]]


def module_selection(base_source: Optional[str],
                     tree_source: str) -> Union[str, dict[str, Tests]]:
  """What runs of one test module; base_source is None for a new one."""
  if base_source is None:
    return ALL
  base, tree = _ModuleShape(base_source), _ModuleShape(tree_source)
  if tree.reaches_old_tests(base):
    return ALL
  chosen: dict[str, Tests] = {}
  for name, shape in tree.classes.items():
    before = base.classes.get(name)
    if (before is None or before.own != shape.own or
        before.helpers() != shape.helpers()):
      chosen[name] = ALL
    else:
      tests = _changed(before.methods, shape.methods)
      if tests:
        chosen[name] = tests
  # A class runs what its bases in the module run: their tests are its.
  grew = True
  while grew:
    grew = False
    for name, shape in tree.classes.items():
      for base_name in shape.bases:
        inherited = chosen.get(base_name)
        if inherited is None or chosen.get(name) == ALL:
          continue
        if inherited == ALL:
          merged: Tests = ALL
        else:
          current = chosen.get(name, [])
          assert isinstance(current, list)
          merged = current + [t for t in inherited if t not in current]
        if merged != chosen.get(name):
          chosen[name] = merged
          grew = True
  return chosen


def series_tests(base_sdk: Path, sdk: Path, modules: list[str]) -> Selection:
  """The selection of each module (paths relative to the sdk folders)."""
  selection: Selection = {}
  for module in modules:
    base_file = base_sdk / module
    base_source = base_file.read_text() if base_file.is_file() else None
    selection[module] = module_selection(
        base_source, (sdk / module).read_text())
  return selection


def _named(name: str, chosen_name: str) -> bool:
  return name == chosen_name or name.startswith(chosen_name + '_')


def is_selected(
    selection: Selection, module: str, class_name: str, test_name: str) -> bool:
  """Whether a collected test of a class runs."""
  chosen = selection.get(module)
  if chosen is None:
    return False
  if chosen == ALL:
    return True
  assert isinstance(chosen, dict)
  for chosen_class, tests in chosen.items():
    if not _named(class_name, chosen_class):
      continue
    if tests == ALL or any(_named(test_name, test) for test in tests):
      return True
  return False


def count(selection: Selection) -> str:
  """A line that says what the selection runs, for the log."""
  parts = []
  for module, chosen in selection.items():
    if chosen == ALL:
      parts.append(f'{module}: whole')
    elif chosen:
      assert isinstance(chosen, dict)
      whole = [name for name, tests in chosen.items() if tests == ALL]
      some = {name: tests for name, tests in chosen.items() if tests != ALL}
      text = f'{module}: {len(whole)} classes whole'
      if some:
        text += (
            f', {sum(len(tests) for tests in some.values())} tests of '
            f'{len(some)} other classes')
      parts.append(text)
    else:
      parts.append(f'{module}: nothing')
  return '; '.join(parts)
