"""mps_health.config.templates: the one expansion, matcher and glob of the pipe/log dir templates.

What the Prolog makes (expand) is what the checks and the Epilog find (match), for
every template the config accepts; a value can never add a path component.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mps_health.config.load import ConfigError, from_mapping
from mps_health.config.templates import TemplateError, expand, glob, match

TEMPLATES = ["/tmp/nvidia-mps_job{job}", "/tmp/mps-{job}-{gpu}", "/tmp/j{job}g{gpu}x",
             "/tmp/{gpu}_{job}"]


@pytest.mark.parametrize("template", TEMPLATES)
@given(job=st.integers(0, 4294967295),
       gpu=st.from_regex(r"[0-9]{1,2}|GPU-[0-9a-f]{8}-[0-9a-f]{4}", fullmatch=True))
def test_what_the_prolog_makes_is_what_the_check_finds(template: str, job: int,
                                                       gpu: str) -> None:
    from_mapping({"mps": {"layout": "per-job", "pipe_dir": template,
                          "log_dir": template.replace("/tmp/", "/var/log/")}}, None)
    gpu = gpu if "{gpu}" in template else ""
    path = expand(template, str(job), gpu)
    assert path.rsplit("/", 1)[0] == "/tmp"
    assert match(template, path.rsplit("/", 1)[1]) == (str(job), gpu)


@pytest.mark.parametrize("job, gpu", [("1/../etc", "0"), ("", "0"), ("12", "../x"),
                                      ("12", ""), ("12", "0/1"), ("1 2", "0")])
def test_a_value_never_adds_a_path_component(job: str, gpu: str) -> None:
    with pytest.raises(TemplateError):
        expand("/tmp/mps-{job}-{gpu}", job, gpu)


def test_names_that_do_not_fit_are_not_instances() -> None:
    for name in ("nvidia-mps_job", "nvidia-mps_jobX", "nvidia-mps_job12.aside-x",
                 "nvidia-mps_job12/", "xnvidia-mps_job12"):
        assert match("/tmp/nvidia-mps_job{job}", name) is None


def test_glob_for_tmpfiles() -> None:
    assert glob("/tmp/mps-{job}-{gpu}") == "/tmp/mps-*-*"
    assert glob("/tmp/nvidia-mps") == "/tmp/nvidia-mps"


def test_the_config_refuses_what_no_prolog_could_make() -> None:
    with pytest.raises(ConfigError):
        from_mapping({"mps": {"layout": "per-job", "pipe_dir": "/tmp/{job}/x"}}, None)
