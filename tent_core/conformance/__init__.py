"""The transport conformance kit: does an installed transport keep the contract the core relies on?

``python -m tent_core.conformance NAME [--json] [--config JSON] [--check NAME ...]`` runs, against
transport NAME as installed (found through its entry point, like the engine finds it), a target
process holding registered buffers and an initiator in this process that drives the transport's
compiled executor through the C ABI:

- ``read_write_exact``: READ and WRITE move exactly the requested bytes between the two processes;
- ``zero_length`` and ``unaligned``: empty slices and odd offsets/lengths, neighbours untouched;
- ``bounds`` and ``permission``: ranges outside registered memory fail with E_BOUNDS, WRITEs into a
  READ-only buffer with E_PERMISSION, where the link claims to refuse them itself
  (:meth:`Transport.access_control`);
- ``concurrent``: hundreds of slices from several threads, every byte checked;
- ``all_or_nothing_submit``: a submit() holding an invalid slice takes all or none of them;
- ``abort_rail``: queued and in-flight slices fail at once, retryably, and the rail recovers;
- ``release_buffer``: after the target released a buffer, slices into it fail;
- ``exactly_once_on_close``: close() with slices outstanding reports each exactly once, then nothing;
- ``wait_read_parks``, ``wait_read_deadline``, ``wait_read_word_access``, ``wait_read_malformed``,
  ``wait_read_bound``: waiting READs (optional, ``Transport.wait_read``) park until the target
  writes their word and then return the bytes written before it; fail E_NOT_READY at their
  deadline; have their word checked like any READ; refuse malformed conditions (the target serves
  on); and are refused beyond the target's parking bound (set through ``Transport.wait_config``).

Every slice is checked to be reported exactly once. A transport that is unavailable here (no
device, no library) has every check skipped with the reason. Exit status: 0 when nothing failed,
1 when a check failed, 2 on a usage error (unknown transport or check).
"""

from .kit import CHECKS, CheckResult, Report, run

__all__ = ["CHECKS", "CheckResult", "Report", "run"]
