# rad2 entry points. Every target that needs the environment bootstraps first (fast when done).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV ?= $(or $(RAD2_VENV),$(CURDIR)/.venv)
# Extra pytest arguments, e.g. make test PYTEST_ARGS="-k dds -x".
PYTEST_ARGS ?=
IN_ROS_ENV := source tools/env.sh &&

.PHONY: help bootstrap build test test-fast demo lint clean distclean

help:
	@echo "make demo       bootstrap, then the closed-loop demo: sim + planner + controller as ROS 2 processes"
	@echo "                on 4 bundled clips; metric + latency tables, MCAP bag, GIF (rad2 demo)"
	@echo "make test       bootstrap, ruff check, then the whole pytest suite (unit, integration, ros)"
	@echo "make test-fast  bootstrap, then the unit tier only (tests/unit, under 2 minutes)"
	@echo "make bootstrap  create .venv with the pinned packages and colcon-build ros2_ws (idempotent)"
	@echo "make build      colcon build ros2_ws again (incremental)"
	@echo "make lint       ruff check of the repository"
	@echo "make clean      remove ros2_ws/build, install and log;  make distclean also removes .venv"

bootstrap:
	@bash tools/bootstrap.sh

build:
	@bash tools/bootstrap.sh --rebuild

lint: bootstrap
	$(VENV)/bin/ruff check .

test: bootstrap
	$(VENV)/bin/ruff check .
	$(IN_ROS_ENV) python -m pytest $(PYTEST_ARGS)

test-fast: bootstrap
	$(IN_ROS_ENV) python -m pytest tests/unit $(PYTEST_ARGS)

demo: bootstrap
	$(IN_ROS_ENV) rad2 demo

clean:
	rm -rf ros2_ws/build ros2_ws/install ros2_ws/log

distclean: clean
	rm -rf $(VENV)
