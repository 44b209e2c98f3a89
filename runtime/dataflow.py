"""``DataflowProgram``: a program's data (``runtime/program.py``) that can check, print and save itself.

The data class knows nothing of its checks (``verify.py``), printer (``textprint.py``) or writer
(``archive_write.py``), and they take plain ``ProgramData``; this class sits above all four and adds
the methods users call. Lowering (``sparsefx.lower``) and the loaders above it (``parse_program`` in
``text.py``, ``load_program`` in ``archive.py``) build it::

    >>> from sparsefx.runtime.mesh import HardwareSpec, MeshSpec
    >>> p = DataflowProgram(MeshSpec(2, 2), HardwareSpec(), "pipelined", "block")
    >>> p.verify()
    >>> str(p).splitlines()[1]
    'mesh 2x2 mode=pipelined placement=block'
    >>> isinstance(p, ProgramData)
    True
"""

from __future__ import annotations

import os

from .archive_write import save_program
from .program import ProgramData
from .textprint import print_program
from .verify import verify_program

__all__ = ["DataflowProgram"]


class DataflowProgram(ProgramData):
    """A lowered model: its data (fields and readers of ``ProgramData``) with verify, print and save.

    ``print(program)`` gives its text form (``runtime/text.py``).
    """

    def verify(self) -> None:
        """Raise ``VerifyError`` naming the kernel and PE if an invariant does not hold (``verify.py``)."""
        verify_program(self)

    def __str__(self) -> str:
        return print_program(self)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the program file (``runtime/archive.py``): manifest, text form, safetensors payloads."""
        save_program(self, path)
