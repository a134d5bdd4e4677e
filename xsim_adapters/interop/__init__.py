"""Peer formats in: traces other tools wrote, turned into our trace with the generator's own
lowering (:mod:`.chakra_import`: Chakra execution traces, ASTRA-sim's workload input).

Sits above :mod:`xsim_adapters.workload` (it lowers imported collectives with
:func:`xsim_adapters.workload.comm.emit.emit_lowered`) and below the backends: it writes a
trace; running it is the backends' business.
"""
