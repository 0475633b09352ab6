"""The torch-free foundation's restricted unpickler (iqtrain.storage.RestrictedUnpickler): a
global it does not admit is refused before it is imported or called; what it admits is what the
pickle gets. Its two users (RadioML pickles, DCP metadata) are tested in
tests/unit/data/convert/test_unpickler.py and tests/unit/distributed/test_dcp.py."""

from __future__ import annotations

import io
import os
import pickle
from collections import OrderedDict

import pytest
from helpers import Forged

from iqtrain.storage import RestrictedUnpickler


def _load(cls: type[RestrictedUnpickler], data: bytes):
    return cls(io.BytesIO(data)).load()


def test_plain_data_needs_no_global_and_every_global_is_refused_by_default(tmp_path):
    data = {"a": [1, 2.5, None, True], ("t", 3): b"x"}
    assert _load(RestrictedUnpickler, pickle.dumps(data, protocol=4)) == data
    marker = tmp_path / "ran"
    for fn, args in ((open, (str(marker), "w")), (os.system, (f"touch '{marker}'",))):
        with pytest.raises(pickle.UnpicklingError, match=r"refused pickle global \S+"):
            _load(RestrictedUnpickler, pickle.dumps(Forged(fn, *args), protocol=2))
    assert not marker.exists()


def test_a_subclass_admits_what_it_names_and_its_refusal_is_its_own():
    class OnlyOrderedDict(RestrictedUnpickler):
        def admit(self, module, name):
            if (module, name) == ("collections", "OrderedDict"):
                return self.import_global(module, name)
            return None

        def refused(self, module, name):
            return ValueError(f"not here: {module}.{name}")

    value = OrderedDict(b=1, a=2)
    assert _load(OnlyOrderedDict, pickle.dumps(value, protocol=2)) == value
    with pytest.raises(ValueError, match=r"not here: (__builtin__|builtins)\.eval"):
        _load(OnlyOrderedDict, pickle.dumps(Forged(eval, "1"), protocol=2))


def test_a_subclass_may_read_an_opcode_its_own_way():
    class NoLists(RestrictedUnpickler):
        def _refuse_list(self):
            raise pickle.UnpicklingError("lists are refused here")

        dispatch = RestrictedUnpickler.with_opcodes({pickle.EMPTY_LIST[0]: _refuse_list})

    assert _load(NoLists, pickle.dumps((1, "a"), protocol=2)) == (1, "a")
    with pytest.raises(pickle.UnpicklingError, match="lists are refused here"):
        _load(NoLists, pickle.dumps([1], protocol=2))
    # the base class's table is unchanged
    assert _load(RestrictedUnpickler, pickle.dumps([1], protocol=2)) == [1]
