"""Every GPU fact envbuild records, checked against `nvidia-smi -q -x` of the same machine."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from envbuild.snapshot.model.gpu import Gpu, GpuSection

MIB = 1 << 20


def number(text: str | None, unit: str) -> float:
    assert text is not None and text.endswith(f" {unit}"), (text, unit)
    return float(text.removesuffix(f" {unit}"))


def enabled(text: str | None) -> bool:
    assert text in ("Enabled", "Disabled"), text
    return text == "Enabled"


def yes(text: str | None) -> bool:
    assert text in ("Yes", "No"), text
    return text == "Yes"


def mib_close(value: int, text: str | None) -> None:
    """nvidia-smi prints whole MiB (rounding its own way): within one MiB."""
    assert abs(value / MIB - number(text, "MiB")) <= 1, (value / MIB, text)


def check_card(gpu: Gpu, card: ET.Element) -> None:
    t = card.findtext
    # identity and memory
    assert gpu.name == t("product_name")
    assert gpu.uuid == t("uuid")
    assert gpu.pci_bus_id is not None and gpu.pci_bus_id.lower() == card.get("id", "").lower()
    mib_close(gpu.memory_total_bytes, t("fb_memory_usage/total"))
    mib_close(gpu.memory_used_bytes, t("fb_memory_usage/used"))
    assert gpu.memory_reserved_bytes is not None
    mib_close(gpu.memory_reserved_bytes, t("fb_memory_usage/reserved"))
    assert gpu.persistence_mode == enabled(t("persistence_mode"))
    assert gpu.ecc_enabled == enabled(t("ecc_mode/current_ecc"))
    assert gpu.mig_enabled == enabled(t("mig_mode/current_mig"))
    smi_procs = {
        int(p.findtext("pid") or -1): number(p.findtext("used_memory"), "MiB")
        for p in card.findall("processes/process_info")
    }
    assert {p.pid for p in gpu.processes} == set(smi_procs)
    for p in gpu.processes:
        assert p.used_memory_bytes is not None
        assert abs(p.used_memory_bytes / MIB - smi_procs[p.pid]) <= 1
    # configuration (drift)
    c = gpu.config
    assert c.serial == t("serial")
    assert c.board_part_number == t("board_part_number")
    assert c.vbios_version == t("vbios_version")
    assert c.inforom_version == t("inforom_version/img_version")
    assert c.compute_mode == {"Default": "default", "Exclusive_Process": "exclusive-process",
                              "Prohibited": "prohibited"}[t("compute_mode") or ""]  # fmt: skip
    assert c.ecc_pending == enabled(t("ecc_mode/pending_ecc"))
    assert c.mig_pending == enabled(t("mig_mode/pending_mig"))
    smi_virt = t("gpu_virtualization_mode/virtualization_mode") or ""
    assert c.virtualization_mode == smi_virt.lower().replace("_", "-"), smi_virt
    assert c.power_limit_w == number(t("gpu_power_readings/current_power_limit"), "W")
    assert c.power_limit_default_w == number(t("gpu_power_readings/default_power_limit"), "W")
    assert c.power_limit_max_w == number(t("gpu_power_readings/max_power_limit"), "W")
    assert c.max_clocks_mhz == {
        "graphics": number(t("max_clocks/graphics_clock"), "MHz"),
        "sm": number(t("max_clocks/sm_clock"), "MHz"),
        "mem": number(t("max_clocks/mem_clock"), "MHz"),
    }
    assert c.application_clocks_mhz == {
        "graphics": number(t("applications_clocks/graphics_clock"), "MHz"),
        "mem": number(t("applications_clocks/mem_clock"), "MHz"),
    }
    link = "pci/pci_gpu_link_info"
    assert c.pcie_max_generation == int(t(f"{link}/pcie_gen/max_link_gen") or -1)
    assert c.pcie_max_width == int((t(f"{link}/link_widths/max_link_width") or "").rstrip("x"))
    assert c.pcie_width == int((t(f"{link}/link_widths/current_link_width") or "").rstrip("x"))
    assert c.bar1_total_bytes is not None
    mib_close(c.bar1_total_bytes, t("bar1_memory_usage/total"))
    assert c.remapped_rows_pending == yes(t("remapped_rows/remapped_row_pending"))
    assert c.remapped_rows_failure == yes(t("remapped_rows/remapped_row_failure"))
    # state (volatile; read a moment apart from nvidia-smi, so within what moves in a second)
    s = gpu.state
    assert s.performance_state == t("performance_state")
    assert s.pcie_generation == int(t(f"{link}/pcie_gen/current_link_gen") or -1)
    assert s.temperature_c is not None
    assert abs(s.temperature_c - number(t("temperature/gpu_temp"), "C")) <= 2
    assert s.power_draw_w is not None
    assert abs(s.power_draw_w - number(t("gpu_power_readings/instant_power_draw"), "W")) <= 10
    assert s.clocks_mhz == {
        "graphics": number(t("clocks/graphics_clock"), "MHz"),
        "sm": number(t("clocks/sm_clock"), "MHz"),
        "mem": number(t("clocks/mem_clock"), "MHz"),
    }
    active = {
        e.tag.removeprefix("clocks_event_reason_").replace("_", "-")
        for e in card.findall("clocks_event_reasons/*")
        if e.text == "Active"
    }
    assert set(s.clocks_event_reasons) == active
    assert s.utilization_gpu_percent == number(t("utilization/gpu_util"), "%")
    assert s.utilization_memory_percent == number(t("utilization/memory_util"), "%")
    assert s.remapped_rows_correctable == int(t("remapped_rows/remapped_row_corr") or -1)
    assert s.remapped_rows_uncorrectable == int(t("remapped_rows/remapped_row_unc") or -1)
    assert s.bar1_used_bytes is not None
    mib_close(s.bar1_used_bytes, t("bar1_memory_usage/used"))


def check_against_xml(section: GpuSection, xml_text: str) -> None:
    root = ET.fromstring(xml_text)
    assert section.available
    assert section.driver_version == root.findtext("driver_version")
    assert section.cuda_driver_version == root.findtext("cuda_version")
    cards = root.findall("gpu")
    assert len(section.gpus) == len(cards) > 0
    for gpu, card in zip(section.gpus, cards, strict=True):
        check_card(gpu, card)
