"""The one exception type for mistakes a user can make.

A `UserError` names the problem and the fix in one line. The scripts catch it at the top,
print `error: <message>` and exit with status 2, so a bad flag, a missing file or a malformed
line of data never shows a traceback. Bugs in our own code stay ordinary exceptions (or
`assert`s) so that they do show one.
"""


class UserError(Exception):
    """A problem with the user's input (options, files, data), with the fix in the message."""
