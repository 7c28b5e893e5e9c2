"""What a bare interpreter imports: the run settings' checks import no torch."""
from tests.support.paths import REPO


def test_checking_the_run_settings_imports_no_torch():
    """start_training.sh asks `--print-sharding` and `--preflight` before every launch: the default settings'
    checks (bucket rules, timeouts, --report-to tensorboard) stay torch-free, so the question takes well under
    a second instead of the ~1.5 s of torch's import."""
    import subprocess
    import sys

    code = ("import sys; from configs.run import RunSettings; RunSettings().validate(3); "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith(('torch', 'acc')))")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
