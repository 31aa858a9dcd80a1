"""The SM count a graph compiles for: a CUDA device's properties, or a described device's."""

from types import SimpleNamespace

from minicomp.backends.cuda.sm_count import H100_SMS, device_sm_count
from minicomp.config import Options
from minicomp.lens.devices import DEVICES, H100
from minicomp.schedule.templates.base import sm_count_of


def test_the_count_is_read_from_the_device_properties():
    asked = []

    def properties(index):
        asked.append(index)
        return SimpleNamespace(multi_processor_count=114, name="H100 PCIe")

    assert device_sm_count(1, get_properties=properties) == 114
    assert asked == [1]


def test_without_a_device_an_h100_is_assumed_like_the_lens():
    assert H100_SMS == H100.sms == 132
    # The templates' heuristics where no options name a count: unchanged on an H100.
    assert sm_count_of(None) == sm_count_of(Options()) == H100_SMS
    assert sm_count_of(Options(sm_count=16)) == 16
    assert {key: d.sms for key, d in DEVICES.items()} == {"h100": 132, "h200": 132, "a100": 108}
