"""``prove --triton`` refuses a kernel it has no launch description for, in one line naming the argument."""

from attnformal.prove import main


def test_unknown_kernel_is_refused(capsys):
    assert main(["--triton", "nosuch:thing"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument '--triton'" in err[0] and "_attn_fwd" in err[0]
