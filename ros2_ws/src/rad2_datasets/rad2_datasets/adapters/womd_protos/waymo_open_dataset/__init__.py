"""Modules generated from waymo-open-dataset's .proto files (see ../README.md)."""
