"""Integrations with the frameworks Python teams already use: :mod:`skiplock.contrib.django`
(Django's connection, the Django Tasks backend, ``manage.py skiplock``) and
:mod:`skiplock.contrib.sqlalchemy` (Session / Connection / AsyncSession / AsyncConnection).
Each needs its framework installed (``pip install 'skiplock[django]'``, ``'skiplock[sqlalchemy]'``);
nothing here is imported by skiplock's own modules."""
