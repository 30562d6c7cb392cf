"""The files resource: single files, trees (upload and download) and watches."""
