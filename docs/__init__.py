"""The documentation pages, installed with the package: ``attnformal docs PAGE`` prints one."""
