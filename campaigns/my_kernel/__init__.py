"""An example of a kernel family that lives outside tilepilot: z = alpha · x + y on vectors
(Triton's 01-vector-add tutorial with a scale), registered when this package is imported.

Run it (from the repository root):

    PYTHONPATH=campaigns TILEPILOT_KERNEL_MODULES=my_kernel tilepilot tune campaigns/my-kernel.toml --backend interpret

`TILEPILOT_KERNEL_MODULES` names modules to import; child processes and Ray workers inherit the
variable, so they find the family too. A package with an entry point in the group
`tilepilot.kernels` (pointing at the family class) works the same without the variable.
"""

from __future__ import annotations

from my_kernel.family import ScaledAddFamily
from tilepilot.kernels import register

register(ScaledAddFamily)

__all__ = ["ScaledAddFamily"]
