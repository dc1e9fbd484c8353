return { 1 }
