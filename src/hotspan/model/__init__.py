"""The data model shared by every part of hotspan: labels, selectors, profile types, samples."""
