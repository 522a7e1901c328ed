mod record_and_check;
